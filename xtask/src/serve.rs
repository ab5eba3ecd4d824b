//! `cargo xtask serve [--port N]`: builds the page and serves it on 127.0.0.1.
use crate::server::Server;
use crate::util::{step, Res};
use crate::{setup, site};

const DEFAULT_PORT: u16 = 8000;

pub fn main(args: &[String]) -> Res<()> {
    let port = parse_port(args)?;
    let wasm_bindgen = setup::wasm_tools()?;
    // wasm-opt comes from the browser tests' npm packages; without Node.js the page is served unoptimized.
    if let Err(e) = setup::npm_packages() {
        println!("note: {e}");
    }
    let dir = site::build(&wasm_bindgen)?;
    let server = Server::start(dir.clone(), port)?;
    step(&format!("serving {}", dir.display()));
    println!("shardlab is at {}  (Ctrl-C stops the server)", server.url());
    server.wait();
    Ok(())
}

fn parse_port(args: &[String]) -> Res<u16> {
    let mut port = DEFAULT_PORT;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let value = match arg.as_str() {
            "--port" | "-p" => it.next().cloned(),
            a if a.starts_with("--port=") => Some(a["--port=".len()..].to_string()),
            other => {
                return Err(format!(
                    "unknown argument `{other}`; usage: cargo xtask serve [--port N]"
                ))
            }
        };
        port = value
            .and_then(|v| v.parse().ok())
            .ok_or("--port needs a number from 0 to 65535, e.g. `cargo xtask serve --port 8080`")?;
    }
    Ok(port)
}

#[cfg(test)]
mod tests {
    use super::parse_port;

    #[test]
    fn port_defaults_to_8000_and_rejects_bad_values() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(parse_port(&[]), Ok(8000));
        assert_eq!(parse_port(&args(&["--port", "9001"])), Ok(9001));
        assert_eq!(parse_port(&args(&["--port=0"])), Ok(0));
        assert!(parse_port(&args(&["--port", "http"])).is_err());
        assert!(parse_port(&args(&["--port"])).is_err());
        assert!(parse_port(&args(&["--verbose"])).is_err());
    }
}
