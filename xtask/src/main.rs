//! Project commands: `cargo xtask serve` (build and serve the page) and `cargo xtask test`
//! (everything CI runs). One module per command; each installs what it needs and can.
mod serve;
mod server;
mod setup;
mod site;
mod test;
mod util;

const USAGE: &str = "usage: cargo xtask <command>

commands:
  serve [--port N]   build the page (release wasm) and serve it on http://127.0.0.1:N/ (default 8000)
  test               everything CI runs: install checks, rustfmt, native tests (lavapipe),
                     the page build and the browser tests (Chromium, WebGPU on SwiftShader)";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("serve") => serve::main(&args[1..]),
        Some("test") => test::main(&args[1..]),
        Some("help" | "-h" | "--help") | None => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(format!("unknown command `{other}`\n\n{USAGE}")),
    };
    if let Err(message) = result {
        if !message.is_empty() {
            eprintln!("\nerror: {message}");
        }
        std::process::exit(1);
    }
}
