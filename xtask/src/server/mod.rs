//! A small static-file HTTP server on 127.0.0.1 (a secure context, so WebGPU is allowed):
//! GET and HEAD only, correct MIME types, nothing outside the served directory, and every
//! connection bounded in bytes and in time.
mod conn;
mod files;
mod listen;

pub use listen::{Limits, Server};
#[cfg(test)]
mod tests;
