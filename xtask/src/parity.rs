//! `cargo xtask parity` (stub).
use anyhow::{bail, Result};

/// Entry point of `cargo xtask parity`.
pub fn run(_args: &[String]) -> Result<()> {
    bail!("`cargo xtask parity` is not implemented yet")
}
