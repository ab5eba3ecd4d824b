//! The server over real sockets on 127.0.0.1: what it serves, and that hostile clients (an
//! endless request line, clients that stall) are cut off in bounded time and memory.
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::files::tests::site;
use super::{Limits, Server};

/// `METHOD TARGET` as a browser on this server's URL sends it, with its Host header.
fn req(server: &Server, line: &str) -> String {
    format!("{line} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\r\n", server.addr.port())
}

/// Sends `request` and reads the response, up to the close (or a reset after it).
fn get(server: &Server, request: &str) -> String {
    let mut s = TcpStream::connect(server.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// A client that sends the start of a request line, then nothing.
fn stall(server: &Server) -> TcpStream {
    let mut s = TcpStream::connect(server.addr).unwrap();
    s.write_all(b"GET /index.h").unwrap();
    s
}

#[test]
fn server_answers_get_head_and_missing_files() {
    let server = Server::start(site("answers"), 0).unwrap();
    let ok = get(&server, &req(&server, "GET /web/app.js"));
    assert!(
        ok.starts_with("HTTP/1.1 200") && ok.contains("text/javascript") && ok.ends_with("\r\n\r\n1"),
        "{ok}"
    );
    let head = get(&server, &req(&server, "HEAD /"));
    assert!(head.starts_with("HTTP/1.1 200") && head.ends_with("\r\n\r\n"), "{head}");
    assert!(get(&server, &req(&server, "GET /../etc/passwd")).starts_with("HTTP/1.1 404"));
    assert!(get(&server, &req(&server, "POST /")).starts_with("HTTP/1.1 405"));
    assert!(get(&server, "hello\r\n\r\n").starts_with("HTTP/1.1 400"));
}

#[test]
fn a_request_for_another_host_gets_421_and_no_file() {
    let server = Server::start(site("host"), 0).unwrap();
    let port = server.addr.port();
    for host in [format!("localhost:{port}"), format!("[::1]:{port}")] {
        let ok = get(&server, &format!("GET /web/app.js HTTP/1.1\r\nHost: {host}\r\n\r\n"));
        assert!(ok.starts_with("HTTP/1.1 200"), "{host}: {ok}");
    }
    // A DNS-rebinding page reaches 127.0.0.1 under its own name; a wrong port or no Host at all
    // is not this server either.
    for head in [
        format!("Host: evil.example:{port}\r\n"),
        format!("Host: 127.0.0.1:{}\r\n", port.wrapping_add(1)),
        String::new(),
    ] {
        let refused = get(&server, &format!("GET /web/app.js HTTP/1.1\r\n{head}\r\n"));
        assert!(refused.starts_with("HTTP/1.1 421"), "{head:?}: {refused}");
        assert!(!refused.ends_with("\r\n\r\n1"), "{head:?}: the file was served");
    }
}

#[test]
fn a_1_gib_request_line_without_a_newline_is_refused_quickly_in_bounded_memory() {
    let server = Server::start(site("endless"), 0).unwrap();
    let mut client = TcpStream::connect(server.addr).unwrap();
    client.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut writer = client.try_clone().unwrap();
    let start = Instant::now();
    // Writes up to 1 GiB of one request line; stops when the server closes the connection.
    let sender = std::thread::spawn(move || {
        let chunk = vec![b'a'; 64 * 1024];
        let _ = writer.write_all(b"GET /");
        let mut sent = 0u64;
        while sent < 1 << 30 {
            match writer.write(&chunk) {
                Ok(n) => sent += n as u64,
                Err(_) => break,
            }
        }
        sent
    });
    let mut response = Vec::new();
    let _ = client.read_to_end(&mut response);
    let sent = sender.join().unwrap();
    let elapsed = start.elapsed();
    // The close may reset the connection before the client reads the 431; either way it was refused.
    let text = String::from_utf8_lossy(&response);
    assert!(response.is_empty() || text.starts_with("HTTP/1.1 431"), "{text}");
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
    // The server read 16 KiB and at most 1 MiB more while lingering; the rest sat in socket buffers.
    assert!(sent < 64 << 20, "the server took {sent} bytes of one request line");
}

#[test]
fn a_stalled_client_gets_408_after_the_read_deadline() {
    let limits = Limits {
        read: Duration::from_millis(300),
        ..Limits::default()
    };
    let server = Server::start_with(site("stalled"), 0, limits).unwrap();
    let mut client = stall(&server);
    client.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let start = Instant::now();
    let mut out = String::new();
    let _ = client.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 408"), "{out}");
    assert!(start.elapsed() < Duration::from_secs(5), "took {:?}", start.elapsed());
}

#[test]
fn slow_clients_do_not_stop_another_request_being_served() {
    let server = Server::start(site("slow"), 0).unwrap();
    // More stalled clients than the old server had workers, each holding its connection open.
    let stalled: Vec<TcpStream> = (0..12).map(|_| stall(&server)).collect();
    let start = Instant::now();
    let ok = get(&server, &req(&server, "GET /index.html"));
    assert!(ok.starts_with("HTTP/1.1 200") && ok.ends_with("<p>hi</p>"), "{ok}");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "served after {:?}, behind the stalled clients",
        start.elapsed()
    );
    drop(stalled);
}

#[test]
fn clients_past_the_connection_limit_get_503_at_once() {
    let limits = Limits {
        connections: 2,
        ..Limits::default()
    };
    let server = Server::start_with(site("busy"), 0, limits).unwrap();
    let stalled: Vec<TcpStream> = (0..2).map(|_| stall(&server)).collect();
    // The acceptor counts a connection only once it takes it: give it the two stalled ones first.
    std::thread::sleep(Duration::from_millis(200));
    let start = Instant::now();
    let busy = get(&server, &req(&server, "GET /"));
    assert!(busy.starts_with("HTTP/1.1 503"), "{busy}");
    assert!(start.elapsed() < Duration::from_secs(3), "took {:?}", start.elapsed());
    drop(stalled);
}
