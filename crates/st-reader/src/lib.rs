//! Safetensors reader for vision-tower checkpoints.
//!
//! Opens a single `.safetensors` file, a model directory (`model.safetensors`, or a lone
//! `*.safetensors`), or a sharded directory (`model.safetensors.index.json`), memory-mapping
//! each file and validating every header the way the `safetensors` crate does. Unknown dtype
//! spellings are listed as [`Dtype::Other`] rather than rejected. The directory's JSON configs
//! are parsed alongside.
//!
//! Memory-mapped files must not change while a [`Checkpoint`] is open (see
//! [`Checkpoint::open`]). Tensor lookups by [`Checkpoint::find`] tolerate an added or dropped
//! `model.` prefix and refuse to guess when both spellings exist.
//!
//! ```
//! # fn main() -> Result<(), st_reader::StError> {
//! # let model_dir = "../../fixtures/readers/safetensors/model_dir";
//! let ckpt = st_reader::Checkpoint::open(model_dir)?;
//! for t in ckpt.tensors() {
//!     println!("{} {} {:?}", t.name, t.dtype, t.shape);
//! }
//! // Tolerates `model.` being added or dropped between releases.
//! let w = ckpt.find("vision_model.embeddings.patch_embedding.weight")?;
//! let values: Vec<f32> = w.to_f32()?;
//! assert_eq!(values.len(), 2 * 3 * 2 * 2);
//! let hidden = ckpt.config().and_then(|c| c.get("hidden_size"));
//! assert_eq!(hidden.and_then(|h| h.as_u64()), Some(2));
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

mod checkpoint;
pub mod config;
mod dtype;
mod error;
mod header;
#[cfg(test)]
mod test_util;
mod view;

pub use checkpoint::{
    Checkpoint, CONFIG_MAX_BYTES, MEMORY_FILE_NAME, SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME,
    TOKENIZER_JSON_MAX_BYTES,
};
pub use dtype::Dtype;
pub use error::{StError, MAX_HEADER_LEN};
pub use view::{TensorInfo, TensorView};

/// Serde's JSON value, as returned for configs.
pub use serde_json::Value;
