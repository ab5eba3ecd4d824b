//! A small static-file HTTP server on 127.0.0.1 (a secure context, so WebGPU is allowed):
//! GET and HEAD only, correct MIME types (application/wasm for streaming compilation),
//! nothing outside the served directory.
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Component, Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use crate::util::Res;

const WORKERS: usize = 4;
const MAX_HEADER_BYTES: usize = 16 * 1024;

pub struct Server {
    pub addr: SocketAddr,
    acceptor: thread::JoinHandle<()>,
}

impl Server {
    /// Serves `root` on 127.0.0.1:`port` (0 picks a free port) from background threads.
    pub fn start(root: PathBuf, port: u16) -> Res<Server> {
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
        let (tx, rx) = mpsc::channel::<TcpStream>();
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..WORKERS {
            let rx = rx.clone();
            let root = root.clone();
            thread::spawn(move || loop {
                let next = rx.lock().map(|r| r.recv());
                match next {
                    Ok(Ok(stream)) => handle(stream, &root),
                    _ => break,
                }
            });
        }
        let acceptor = thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                if tx.send(stream).is_err() {
                    break;
                }
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

fn handle(mut stream: TcpStream, root: &Path) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(30)));
    let (method, target) = match read_request(&stream) {
        Some(r) => r,
        None => return respond(&mut stream, 400, "text/plain; charset=utf-8", b"bad request\n", false),
    };
    let head = method == "HEAD";
    if method != "GET" && !head {
        return respond(
            &mut stream,
            405,
            "text/plain; charset=utf-8",
            b"only GET and HEAD\n",
            false,
        );
    }
    match resolve(root, &target).and_then(|p| std::fs::read(&p).ok().map(|body| (p, body))) {
        Some((path, body)) => respond(&mut stream, 200, content_type(&path), &body, head),
        None => respond(&mut stream, 404, "text/plain; charset=utf-8", b"not found\n", head),
    }
}

/// The request line's method and target; the headers are read and ignored.
fn read_request(stream: &TcpStream) -> Option<(String, String)> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next()?.to_string(), parts.next()?.to_string());
    let mut total = line.len();
    loop {
        let mut header = String::new();
        let n = reader.read_line(&mut header).ok()?;
        total += n;
        if n == 0 || header == "\r\n" || header == "\n" || total > MAX_HEADER_BYTES {
            break;
        }
    }
    Some((method, target))
}

fn respond(stream: &mut TcpStream, code: u16, content_type: &str, body: &[u8], head: bool) {
    let reason = match code {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        _ => "Method Not Allowed",
    };
    let header = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Cache-Control: no-cache\r\nX-Content-Type-Options: nosniff\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(header.as_bytes());
    if !head {
        let _ = stream.write_all(body);
    }
    let _ = stream.flush();
}

/// The file under `root` that a request target names, or None when it names nothing there
/// (missing, malformed, or escaping `root` through `..`, a backslash or a symlink).
pub fn resolve(root: &Path, target: &str) -> Option<PathBuf> {
    let path = target.split(['?', '#']).next()?;
    if !path.starts_with('/') {
        return None;
    }
    let decoded = percent_decode(path)?;
    let mut file = root.to_path_buf();
    for segment in decoded.split('/') {
        match segment {
            "" | "." => continue,
            ".." => return None,
            s if s.contains('\\') || s.contains('\0') || s.contains(':') => return None,
            s => file.push(s),
        }
    }
    // Only plain segments were pushed; still, check the result is a normal path below root.
    if file
        .strip_prefix(root)
        .ok()?
        .components()
        .any(|c| !matches!(c, Component::Normal(_)))
    {
        return None;
    }
    if file.is_dir() {
        file.push("index.html");
    }
    let real = file.canonicalize().ok()?;
    (real.starts_with(root) && real.is_file()).then_some(real)
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The Content-Type of a served file, by extension.
pub fn content_type(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()).unwrap_or("") {
        "html" | "htm" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "wasm" => "application/wasm",
        "json" | "map" => "application/json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "txt" | "wgsl" | "py" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xtask-server-test-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("web")).unwrap();
        std::fs::write(dir.join("index.html"), "<p>hi</p>").unwrap();
        std::fs::write(dir.join("web").join("app.js"), "1").unwrap();
        dir.canonicalize().unwrap()
    }

    #[test]
    fn resolve_serves_files_and_index_but_never_escapes_the_root() {
        let root = site();
        assert_eq!(resolve(&root, "/"), Some(root.join("index.html")));
        assert_eq!(resolve(&root, "/web/app.js?v=1"), Some(root.join("web/app.js")));
        assert_eq!(resolve(&root, "/web/%61pp.js"), Some(root.join("web/app.js")));
        assert_eq!(resolve(&root, "/web/missing.js"), None);
        for escape in [
            "/../Cargo.toml",
            "/web/../../x",
            "/%2e%2e/x",
            "/..%2fx",
            "/web\\..\\..\\x",
            "x",
            "/%zz",
            "/a%00b",
        ] {
            assert_eq!(resolve(&root, escape), None, "{escape}");
        }
    }

    #[test]
    fn content_type_is_application_wasm_for_wasm_and_javascript_for_modules() {
        assert_eq!(content_type(Path::new("pkg/a_bg.wasm")), "application/wasm");
        assert_eq!(content_type(Path::new("pkg/a.js")), "text/javascript; charset=utf-8");
        assert_eq!(content_type(Path::new("index.html")), "text/html; charset=utf-8");
        assert_eq!(content_type(Path::new("web/style.css")), "text/css; charset=utf-8");
    }

    #[test]
    fn server_answers_get_head_and_missing_files() {
        use std::io::Read;
        let root = site();
        let server = Server::start(root, 0).unwrap();
        let get = |req: &str| {
            let mut s = TcpStream::connect(server.addr).unwrap();
            s.write_all(req.as_bytes()).unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            out
        };
        let ok = get("GET /web/app.js HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(
            ok.starts_with("HTTP/1.1 200") && ok.contains("text/javascript") && ok.ends_with("\r\n\r\n1"),
            "{ok}"
        );
        let head = get("HEAD / HTTP/1.1\r\n\r\n");
        assert!(head.starts_with("HTTP/1.1 200") && head.ends_with("\r\n\r\n"), "{head}");
        assert!(get("GET /../etc/passwd HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(get("POST / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
    }
}
