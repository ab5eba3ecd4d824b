//! Standard output for a command line that may be piped into `head`.
use std::fmt;
use std::io::{ErrorKind, Write};

/// Writes `args` to stdout. A reader that has gone (a broken pipe) ends the process quietly
/// with status 0: the output it wanted was written. Any other write error ends it with the
/// usual one-line error and status 2.
pub fn write(args: fmt::Arguments) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.flush()) {
        if e.kind() == ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: cannot write to stdout: {e}");
        std::process::exit(2);
    }
}
