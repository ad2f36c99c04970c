//! `cargo xtask ptx` and `cargo xtask gpu-test` (stubs).
use anyhow::{bail, Result};

/// Entry point of `cargo xtask ptx`.
pub fn ptx(_args: &[String]) -> Result<()> {
    bail!("`cargo xtask ptx` is not implemented yet")
}

/// Entry point of `cargo xtask gpu-test`.
pub fn gpu_test(_args: &[String]) -> Result<()> {
    bail!("`cargo xtask gpu-test` is not implemented yet")
}
