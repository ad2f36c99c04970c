//! The contract every other crate of vision-towers agrees on, with no dependency of its own:
//!
//! - [`Precision`]: the arithmetic a tower runs in, one type for the towers, the GPU engine, the
//!   facade, the bindings and xtask;
//! - [`LmAttention`]: how the language model attends over an image's rows;
//! - [`Activation`]: the activation functions the towers' MLPs use, by their transformers names;
//! - [`config`]: the config checks every family makes and their one error, [`ConfigError`];
//! - [`ErrorKind`] and [`Classify`]: whose fault a failure is (the weights, the input, the
//!   device…), stated by the error itself so that no binding guesses it from the call;
//! - [`HostTower`]: a family's host reference behind one trait;
//! - [`rel_l2`]: the one distance every check of rows against a reference uses;
//! - each family's typed input for one image ([`GemmaImage`], [`GlmImage`], [`StepImage`] of
//!   [`StepView`]s), what vision-prep produces and the towers read.
//!
//! The crate sits below vision-prep, gpu-core and the tower crates (ripgrep's `grep-matcher` is
//! the model): a law of one family never lives here, only the vocabulary the families share.

mod act;
pub mod config;
mod error;
mod host;
mod inputs;
mod lm;
mod metric;
mod precision;

pub use act::{Activation, UnknownActivation, ACTIVATION_NAMES};
pub use config::ConfigError;
pub use error::{ClassifiedError, Classify, ErrorKind, FamilyError};
pub use host::HostTower;
pub use inputs::{GemmaImage, GlmImage, StepImage, StepView};
pub use lm::LmAttention;
pub use metric::rel_l2;
pub use precision::{ParsePrecisionError, Precision};
