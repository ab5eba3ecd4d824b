//! The listener: one thread per connection, at most `Limits::connections` at a time, so slow
//! clients wait out their own deadlines without keeping others from being served.
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use super::conn::handle;
use crate::util::Res;

/// What one connection may cost. A client holds a thread for at most `read + write` (plus a
/// second of lingering after an error) and memory for at most `header_bytes` beyond the file
/// it asked for; past `connections` at once, new ones get 503 at once.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub connections: usize,
    /// The request line and headers together.
    pub header_bytes: usize,
    /// For the whole request head to arrive.
    pub read: Duration,
    /// For the whole response to be taken.
    pub write: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connections: 64,
            header_bytes: 16 * 1024,
            read: Duration::from_secs(5),
            write: Duration::from_secs(10),
        }
    }
}

pub struct Server {
    pub addr: SocketAddr,
    acceptor: thread::JoinHandle<()>,
}

/// Counts a connection while it is alive, also when its thread could not be started.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Server {
    /// Serves `root` on 127.0.0.1:`port` (0 picks a free port) from background threads.
    pub fn start(root: PathBuf, port: u16) -> Res<Server> {
        Server::start_with(root, port, Limits::default())
    }

    pub fn start_with(root: PathBuf, port: u16, limits: Limits) -> Res<Server> {
        let listener = TcpListener::bind(("127.0.0.1", port)).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AddrInUse {
                format!(
                    "port {port} is in use; pick another with `cargo xtask serve --port {}`",
                    port.wrapping_add(1)
                )
            } else {
                format!("cannot listen on 127.0.0.1:{port}: {e}")
            }
        })?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let root = Arc::new(
            root.canonicalize()
                .map_err(|e| format!("cannot serve {}: {e}", root.display()))?,
        );
        let active = Arc::new(AtomicUsize::new(0));
        let port = addr.port();
        let acceptor = thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                accept(stream, &root, &limits, &active, port);
            }
        });
        Ok(Server { addr, acceptor })
    }

    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// Blocks for as long as the server runs (until the process is stopped).
    pub fn wait(self) {
        let _ = self.acceptor.join();
    }
}

fn accept(stream: TcpStream, root: &Arc<PathBuf>, limits: &Limits, active: &Arc<AtomicUsize>, port: u16) {
    if active.fetch_add(1, Ordering::SeqCst) >= limits.connections {
        active.fetch_sub(1, Ordering::SeqCst);
        return busy(stream);
    }
    let slot = Slot(active.clone());
    let (root, limits) = (root.clone(), *limits);
    // When the thread cannot start, the closure and its slot are dropped and the client sees a close.
    let _ = thread::Builder::new().name("xtask-http".into()).spawn(move || {
        let _slot = slot;
        handle(stream, Path::new(root.as_ref()), &limits, port);
    });
}

/// 503 without waiting for the client: the response fits in the socket's buffer, and a
/// non-blocking write never holds the acceptor.
fn busy(mut stream: TcpStream) {
    let _ = stream.set_nonblocking(true);
    let _ = stream.write_all(
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n\
          Content-Length: 17\r\nRetry-After: 1\r\nConnection: close\r\n\r\ntoo many clients\n",
    );
}
