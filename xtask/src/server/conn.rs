//! One connection: read the request head into a fixed buffer before a deadline, answer with
//! the file or an error before another deadline, and close. A client that sends too much or
//! too slowly gets 431 or 408, so it holds no more than the buffer and the two deadlines. A
//! request must name this server as its Host (127.0.0.1, localhost or `[::1]`, with its port):
//! a page on another name that a DNS-rebinding attack points here gets 421 and no file.
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use super::files::{content_type, resolve};
use super::Limits;

/// Why a request head could not be read.
#[derive(Debug, PartialEq, Eq)]
enum Refused {
    /// The request line and headers exceed the byte limit.
    TooLarge,
    /// The head did not arrive before the read deadline.
    Timeout,
    /// Not an HTTP request line.
    Malformed,
    /// The client closed or reset the connection.
    Closed,
}

const TEXT: &str = "text/plain; charset=utf-8";

/// The request line's method and target, and the Host header's value.
#[derive(Debug, PartialEq, Eq)]
struct Head {
    method: String,
    target: String,
    host: Option<String>,
}

/// Whether `host` (a Host header's value) names this server: a loopback name with `port`, or
/// without a port when `port` is HTTP's default.
fn host_allowed(host: &str, port: u16) -> bool {
    let host = host.trim().to_ascii_lowercase();
    let (name, rest) = match host.strip_prefix("[::1]") {
        Some(rest) => ("[::1]", rest),
        None => host.find(':').map_or((host.as_str(), ""), |i| (&host[..i], &host[i..])),
    };
    let port_ok = match rest.strip_prefix(':') {
        Some(p) => !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && p.parse::<u16>() == Ok(port),
        None => rest.is_empty() && port == 80,
    };
    matches!(name, "127.0.0.1" | "localhost" | "[::1]") && port_ok
}

/// Serves one request on `stream` from `root`, for a client that names this server's `port`.
pub fn handle(mut stream: TcpStream, root: &Path, limits: &Limits, port: u16) {
    let Head { method, target, host } = match read_head(&mut stream, limits) {
        Ok(head) => head,
        Err(refused) => {
            let (code, body): (u16, &[u8]) = match refused {
                Refused::TooLarge => (431, b"request line and headers too large\n"),
                Refused::Timeout => (408, b"request timed out\n"),
                Refused::Malformed => (400, b"bad request\n"),
                Refused::Closed => return,
            };
            respond(&mut stream, limits, code, TEXT, body, false);
            return linger(stream, limits);
        }
    };
    if !host.as_deref().is_some_and(|h| host_allowed(h, port)) {
        let body = format!("this server answers only 127.0.0.1:{port}, localhost:{port} and [::1]:{port}\n");
        return respond(&mut stream, limits, 421, TEXT, body.as_bytes(), false);
    }
    let head = method == "HEAD";
    if method != "GET" && !head {
        return respond(&mut stream, limits, 405, TEXT, b"only GET and HEAD\n", false);
    }
    match resolve(root, &target).and_then(|p| std::fs::read(&p).ok().map(|body| (p, body))) {
        Some((path, body)) => respond(&mut stream, limits, 200, content_type(&path), &body, head),
        None => respond(&mut stream, limits, 404, TEXT, b"not found\n", head),
    }
}

/// The time left before `deadline`, or None when it has passed (a zero timeout is not allowed).
fn left(deadline: Instant) -> Option<Duration> {
    Some(deadline.saturating_duration_since(Instant::now())).filter(|d| !d.is_zero())
}

/// The request line and the Host header, read with the other headers (which are ignored) into
/// a buffer of `limits.header_bytes`, all before `limits.read` has passed.
fn read_head(stream: &mut TcpStream, limits: &Limits) -> Result<Head, Refused> {
    let deadline = Instant::now() + limits.read;
    let mut buf = vec![0u8; limits.header_bytes];
    let mut len = 0;
    loop {
        let Some(timeout) = left(deadline) else {
            return Err(Refused::Timeout);
        };
        stream.set_read_timeout(Some(timeout)).map_err(|_| Refused::Closed)?;
        match stream.read(&mut buf[len..]) {
            Ok(0) if len == 0 => return Err(Refused::Closed),
            Ok(0) => return Err(Refused::Malformed),
            Ok(n) => {
                // The blank line may straddle two reads: look again from just before the new bytes.
                let from = len.saturating_sub(3);
                len += n;
                if let Some(end) = head_end(&buf[from..len]) {
                    return request_line(&buf[..from + end]);
                }
                if len == buf.len() {
                    return Err(Refused::TooLarge);
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return Err(Refused::Timeout),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Err(Refused::Closed),
        }
    }
}

/// Where the head ends in `bytes` (just past its blank line), if it does.
fn head_end(bytes: &[u8]) -> Option<usize> {
    (0..bytes.len()).find_map(|i| {
        let rest = &bytes[i..];
        if rest.starts_with(b"\r\n\r\n") {
            Some(i + 4)
        } else if rest.starts_with(b"\n\n") {
            Some(i + 2)
        } else {
            None
        }
    })
}

fn request_line(head: &[u8]) -> Result<Head, Refused> {
    let mut lines = head.split(|&b| b == b'\n');
    let line = lines.next().unwrap_or_default();
    let line = std::str::from_utf8(line).map_err(|_| Refused::Malformed)?;
    let mut parts = line.split_whitespace();
    let (method, target) = match (parts.next(), parts.next(), parts.next()) {
        (Some(method), Some(target), Some(version)) if version.starts_with("HTTP/") => (method, target),
        _ => return Err(Refused::Malformed),
    };
    // The first Host header; a header that is not UTF-8 is no Host.
    let host = lines.find_map(|l| {
        let l = std::str::from_utf8(l).ok()?;
        let (name, value) = l.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("host")
            .then(|| value.trim().to_string())
    });
    Ok(Head {
        method: method.to_string(),
        target: target.to_string(),
        host,
    })
}

/// Writes the whole response before `limits.write` has passed, or gives up.
fn respond(stream: &mut TcpStream, limits: &Limits, code: u16, content_type: &str, body: &[u8], head: bool) {
    let reason = match code {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        421 => "Misdirected Request",
        431 => "Request Header Fields Too Large",
        _ => "Service Unavailable",
    };
    let header = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Cache-Control: no-cache\r\nX-Content-Type-Options: nosniff\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let deadline = Instant::now() + limits.write;
    let body = if head { &[][..] } else { body };
    for part in [header.as_bytes(), body] {
        // A slow reader takes a little at a time: each write gets only the time left.
        for chunk in part.chunks(64 * 1024) {
            let mut chunk = chunk;
            while !chunk.is_empty() {
                let Some(timeout) = left(deadline) else { return };
                if stream.set_write_timeout(Some(timeout)).is_err() {
                    return;
                }
                match stream.write(chunk) {
                    Ok(0) => return,
                    Ok(n) => chunk = &chunk[n..],
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(_) => return,
                }
            }
        }
    }
}

/// After an error response with the request still arriving, reads and drops a little of it
/// (at most 1 MiB, for at most a second) so the client can read the response before the
/// close resets the connection.
fn linger(mut stream: TcpStream, limits: &Limits) {
    let _ = stream.shutdown(Shutdown::Write);
    let deadline = Instant::now() + limits.read.min(Duration::from_secs(1));
    let mut sink = [0u8; 8192];
    let mut budget = 1usize << 20;
    while budget > 0 {
        let Some(timeout) = left(deadline) else { return };
        if stream.set_read_timeout(Some(timeout)).is_err() {
            return;
        }
        match stream.read(&mut sink) {
            Ok(0) => return,
            Ok(n) => budget = budget.saturating_sub(n),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_head_ends_at_the_first_blank_line_with_either_line_ending() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: x\r\n\r\nbody"), Some(27));
        assert_eq!(head_end(b"GET / HTTP/1.1\n\n"), Some(16));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: x\r\n"), None);
    }

    #[test]
    fn a_request_line_needs_a_method_a_target_and_an_http_version() {
        assert_eq!(
            request_line(b"GET /a.js HTTP/1.1\r\nAccept: */*\r\nhost:  x:1 \r\n\r\n"),
            Ok(Head {
                method: "GET".into(),
                target: "/a.js".into(),
                host: Some("x:1".into())
            })
        );
        assert_eq!(request_line(b"GET /a.js\r\n\r\n"), Err(Refused::Malformed));
        assert_eq!(request_line(b"\xff\xfe / HTTP/1.1\r\n\r\n"), Err(Refused::Malformed));
    }

    #[test]
    fn only_a_loopback_name_with_the_servers_port_is_this_server() {
        for ok in [
            "127.0.0.1:8000",
            "localhost:8000",
            "LOCALHOST:8000",
            "[::1]:8000",
            " 127.0.0.1:8000 ",
        ] {
            assert!(host_allowed(ok, 8000), "{ok}");
        }
        for bad in [
            "evil.example:8000",
            "127.0.0.1:8001",
            "127.0.0.1",
            "localhost.evil.example:8000",
            "127.0.0.1:+8000",
            "127.0.0.1:",
            "[::1]",
            "",
        ] {
            assert!(!host_allowed(bad, 8000), "{bad}");
        }
        assert!(host_allowed("localhost", 80));
    }
}
