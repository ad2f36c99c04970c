//! Reader for GGUF v2 and v3 files (llama.cpp / ggml's model format), built for hostile input.
//!
//! [`GgufFile`] parses the header, every metadata value type (nested arrays included) and the
//! tensor-info table, then checks the layout: offsets aligned to `general.alignment`, inside
//! the file and not overlapping. Every count and length is checked against the bytes that
//! remain before anything is allocated, so a lying file costs an error, not memory.
//! Tensors convert to f32 or bf16 from F32, F16, BF16 and Q8_0; every other ggml type is
//! listed with its block and type size and refused by name on conversion.
//!
//! ```
//! use gguf_reader::{GgmlType, GgufFile};
//!
//! let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/readers/gguf/tiny_v3.gguf");
//! let file = GgufFile::open(path)?;
//! assert_eq!(file.version(), 3);
//! assert_eq!(file.get_str("general.architecture")?, "clip");
//! assert_eq!(file.get_u32("clip.vision.image_size")?, 224);
//!
//! let q = file.require_tensor("v.blk.0.ffn_down.weight")?;
//! assert_eq!(q.ggml_type, GgmlType::Q8_0);
//! assert_eq!(q.shape(), [3, 64]); // outermost first; q.ne is [64, 3]
//! assert_eq!(file.to_f32(q)?.len(), 192);
//! # Ok::<(), gguf_reader::GgufError>(())
//! ```
#![deny(missing_docs)]

mod error;
mod file;
mod ggml_type;
mod metadata;
mod parse;
mod tensor;

pub use error::GgufError;
pub use file::GgufFile;
pub use ggml_type::GgmlType;
pub use metadata::{MetaArray, MetaValue, ValueType};
pub use parse::{
    ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGML_MAX_DIMS, MAX_ARRAY_DEPTH, MAX_KEY_LEN, MAX_STRING_LEN,
};
pub use tensor::{TensorInfo, TensorView};
