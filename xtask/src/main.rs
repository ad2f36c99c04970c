//! `cargo xtask <command>`: the project's automation, in the rust-analyzer manner.

use anyhow::{bail, Result};
use std::path::PathBuf;

const USAGE: &str = "usage: cargo xtask <command>

commands:
  fixtures   regenerate the oracle fixtures from upstream (makes its own Python venv)
  parity     compare every available path against the oracle fixtures and print the table
";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first() else {
        eprint!("{USAGE}");
        bail!("no command given");
    };
    let rest = &args[1..];
    match cmd.as_str() {
        "-h" | "--help" | "help" => {
            print!("{USAGE}");
            Ok(())
        }
        other => {
            let _ = rest;
            eprint!("{USAGE}");
            bail!("unknown command `{other}`")
        }
    }
}

/// The workspace root (the parent of `xtask/`).
#[allow(dead_code)]
fn workspace_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().map(PathBuf::from).unwrap_or(here)
}
