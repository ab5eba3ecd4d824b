//! Reverse-mode autodiff over the IR: one VJP rule per op (`vjp`), and
//! [`value_and_grad`] which sweeps a traced program backwards.
mod grad;
mod vjp;

pub use grad::{grad, grad_with, value_and_grad, vjp_with};
