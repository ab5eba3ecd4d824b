//! Project commands: `cargo xtask serve` (build and serve the page) and `cargo xtask test`
//! (everything CI runs). One module per command; each installs what it needs and can.
mod counts;
mod device_bench;
mod jax;
mod serve;
mod server;
mod setup;
mod site;
mod steps;
mod test;
mod util;

fn usage() -> String {
    format!(
        "usage: cargo xtask <command>

commands:
  serve [--port N]   build the page (release wasm) and serve it on http://127.0.0.1:N/ (default 8000)
  device-bench [--dry-run] [--shardlab PATH] [--python PATH] [--wheels DIR] [--memory-budget SIZE]
               [--deadline SECONDS] [--out FILE]
                     the prepared benchmark for a machine with a GPU: kernels, train steps, peers,
                     compare; one Markdown report (default target/device-bench/report.md)
  test [STEP...]     everything CI runs, or only the named steps:
{}

environment (test):
  SHARDLAB_ALLOW_NO_GPU=1   GPU tests that find no adapter count as skipped instead of failing
  SHARDLAB_ALLOW_NO_JAX=1   export tests that find no JAX count as skipped instead of failing
  SHARDLAB_PYTHON=PATH      the Python of the export tests (default: the jax step's target/jax-venv)",
        steps::help()
            .lines()
            .map(|l| format!("    {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    )
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("serve") => serve::main(&args[1..]),
        Some("test") => test::main(&args[1..]),
        Some("device-bench") => device_bench::main(&args[1..]),
        Some("help" | "-h" | "--help") | None => {
            println!("{}", usage());
            Ok(())
        }
        Some(other) => Err(format!("unknown command `{other}`\n\n{}", usage())),
    };
    if let Err(message) = result {
        if !message.is_empty() {
            eprintln!("\nerror: {message}");
        }
        std::process::exit(1);
    }
}
