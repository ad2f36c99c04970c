//! vision-towers: image bytes plus a model's weight file in, the embedding rows a
//! vision-language model splices into its prompt out.
//!
//! This facade re-exports the narrow crates that do the work, opens a weight file of either
//! format ([`WeightFile`]), detects which model family it belongs to ([`Family`]), and runs its
//! tower on the CPU or a CUDA device ([`Device`], [`Model`]).
//!
//! One name per concept: [`Device`] is where a tower runs (`auto`, `cpu`, `cuda:N`); gpu-core's
//! CUDA context stays `gpu_core::Device` in the re-exported crate and is never exported at this
//! crate's root. [`LmAttention`] is the one LM attention law of every family (gpu-core's, each
//! tower crate's `lm_attention`); every family's LM width is its config's `text_hidden`.
#![deny(missing_docs)]

mod cuda_engine;
mod device_rows;
mod engine;
mod families;
mod family;
mod inputs;
mod inspect;
mod model;
mod options;
mod prep;
mod session;
mod st_write;
mod stream;
mod tensors;
mod tower;
mod tower_error;
mod upload;
mod video;
mod weights;

pub use device_rows::{rows_dtype_refusal, DeviceOut, DeviceRows, RequestTimings};
pub use family::{detect_family, family_from_gguf_projector, family_from_model_type, Family};
pub use gpu_core::{parse_tier, FAKE_DEVICE_ENV, FORCE_TIER_ENV};
pub use gpu_core::{RowsDtype, PER_THREAD_DEFAULT_STREAM};
pub use inspect::inspect_json;
pub use model::{DeviceEncoded, Encoded, Model, ModelError};
pub use options::{
    Device, ParseDeviceError, Precision, TowerOptions, DEFAULT_MAX_PATCHES_PER_PASS,
};
pub use prep::{preprocessor_for, read_image_arg, ImageArg, PrepOpenError, MAX_IMAGE_FILE_BYTES};
pub use st_write::{safetensors_bytes, write_safetensors, OutDtype, OutTensor, WriteError};
pub use stream::{BatchPolicy, PassStat, StreamStats};
pub use tensors::{ProcessorTensors, TensorShapeError};
pub use tower::{Rows, Tower};
pub use tower_core::LmAttention;
pub use tower_error::TowerError;
pub use video::{video_preprocessor_for, DeviceEncodedVideo, EncodedVideo};
pub use weights::WeightFile;

pub use gguf_reader;
pub use gpu_core;
pub use st_reader;
pub use tower_core;
pub use tower_gemma;
pub use tower_glm5;
pub use tower_step;
pub use vision_prep;

use std::path::PathBuf;

/// Everything that can go wrong in the facade, by cause.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The GGUF reader refused the file.
    #[error("{path}: {source}")]
    Gguf {
        /// The file that was read.
        path: PathBuf,
        /// What the reader found wrong.
        #[source]
        source: Box<gguf_reader::GgufError>,
    },
    /// The safetensors reader refused the file or directory (its message names the file).
    #[error("{}", with_path(path, source))]
    SafeTensors {
        /// The file or directory that was read.
        path: PathBuf,
        /// What the reader found wrong.
        #[source]
        source: Box<st_reader::StError>,
    },
    /// The path could not be read at all.
    #[error("{path}: {source}")]
    Io {
        /// The path that failed.
        path: PathBuf,
        /// The operating system's answer.
        #[source]
        source: std::io::Error,
    },
    /// A directory holds GGUF files but no safetensors checkpoint: name the file to use.
    #[error("{path}: a directory of GGUF files ({files}); name one of them")]
    GgufDirectory {
        /// The directory.
        path: PathBuf,
        /// The GGUF files in it, comma-separated.
        files: String,
    },
    /// The file is neither GGUF nor safetensors.
    #[error("{path}: not a GGUF or safetensors file (magic bytes {magic})")]
    UnknownFormat {
        /// The file that was read.
        path: PathBuf,
        /// The first bytes found, in hex.
        magic: String,
    },
}

/// `source`'s message, prefixed with `path` unless the message already names it.
fn with_path(path: &std::path::Path, source: &dyn std::fmt::Display) -> String {
    let msg = source.to_string();
    let shown = path.display().to_string();
    if msg.contains(&shown) {
        msg
    } else {
        format!("{shown}: {msg}")
    }
}
