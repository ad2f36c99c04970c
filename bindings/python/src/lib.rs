//! Python bindings of vision-towers: the extension module `vision_towers._vision_towers`
//! (PyO3, abi3 for CPython >= 3.9, built by maturin from `pyproject.toml`).
//!
//! Without the `python` feature this crate builds only its pure-Rust parts, which
//! `cargo test --workspace` tests without a Python interpreter: the DLPack structs and the
//! deleters of exported tensors ([`dlpack`]) and the failure classes ([`failure`]). maturin turns
//! the feature on.
#![deny(missing_docs)]

pub mod dlpack;
pub mod failure;

#[cfg(feature = "python")]
mod py;
