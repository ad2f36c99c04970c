//! `cargo xtask fixtures` (stub).
use anyhow::{bail, Result};

/// Entry point of `cargo xtask fixtures`.
pub fn run(_args: &[String]) -> Result<()> {
    bail!("`cargo xtask fixtures` is not implemented yet")
}
