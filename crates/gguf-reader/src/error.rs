//! The crate's one error type.

use std::path::PathBuf;

use crate::GgmlType;

/// Everything that can go wrong while reading a GGUF file or converting one of its tensors.
///
/// Parse errors do not repeat the file's path (callers that opened by path add it, as the
/// facade does); I/O errors carry it. `location` fields say where in the file the problem was found, e.g. `metadata entry #3`,
/// `metadata key "general.name"` or `tensor info "v.blk.0.attn_q.weight"`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The file could not be opened, measured, mapped or read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },

    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file: magic is {found:02x?}, expected \"GGUF\"")]
    BadMagic {
        /// The bytes found (fewer than four when the file is that short).
        found: Vec<u8>,
    },

    /// The version is not 2 or 3 (v1 used 32-bit counts and is not read).
    #[error("GGUF version {version} is not supported (this reader reads v2 and v3)")]
    UnsupportedVersion {
        /// The version field as read (little-endian).
        version: u32,
    },

    /// The version field reads as a byte-swapped 2 or 3: a big-endian GGUF file.
    #[error("big-endian GGUF (version field {version:#010x}) is not supported")]
    BigEndian {
        /// The version field as read (little-endian).
        version: u32,
    },

    /// The file ends before a field that must be there.
    #[error("truncated file: {location}: {field} needs {needed} bytes at offset {offset}, only {available} remain")]
    Truncated {
        /// Where in the file.
        location: String,
        /// Which field was being read.
        field: &'static str,
        /// Byte offset of the field in the file.
        offset: u64,
        /// Bytes the field needs.
        needed: u64,
        /// Bytes left in the file.
        available: u64,
    },

    /// A count says more items than the remaining bytes could possibly hold.
    #[error("{location}: {field} {count} cannot fit in the {available} bytes that remain (each item takes at least {min_size} bytes)")]
    CountTooLarge {
        /// Where in the file.
        location: String,
        /// Which count.
        field: &'static str,
        /// The count as read.
        count: u64,
        /// The smallest encoding of one item, in bytes.
        min_size: u64,
        /// Bytes left in the file.
        available: u64,
    },

    /// A key, tensor name or string value is longer than this reader accepts.
    #[error("{location}: {field} of {len} bytes exceeds the {max}-byte limit")]
    StringTooLong {
        /// Where in the file.
        location: String,
        /// Which string.
        field: &'static str,
        /// The length as read.
        len: u64,
        /// The limit.
        max: u64,
    },

    /// A key or tensor name is not valid UTF-8.
    #[error("{location}: {field} is not valid UTF-8")]
    InvalidUtf8 {
        /// Where in the file.
        location: String,
        /// Which string.
        field: &'static str,
    },

    /// A metadata value type id outside 0..=12.
    #[error("{location}: unknown metadata value type {id}")]
    UnknownValueType {
        /// Where in the file.
        location: String,
        /// The type id as read.
        id: u32,
    },

    /// A bool value byte other than 0 or 1.
    #[error("{location}: bool byte {byte} is neither 0 nor 1")]
    InvalidBool {
        /// Where in the file.
        location: String,
        /// The byte as read.
        byte: u8,
    },

    /// Arrays nested deeper than [`crate::MAX_ARRAY_DEPTH`].
    #[error("{location}: arrays nested deeper than {max} levels")]
    NestingTooDeep {
        /// Where in the file.
        location: String,
        /// The limit.
        max: usize,
    },

    /// The same metadata key appears twice.
    #[error("duplicate metadata key {key:?}")]
    DuplicateKey {
        /// The key.
        key: String,
    },

    /// `general.alignment` is not a non-zero power of two stored as u32.
    #[error("general.alignment is {found}; it must be a u32 non-zero power of two")]
    BadAlignment {
        /// The value or type found, e.g. `3` or `a i32 value`.
        found: String,
    },

    /// A tensor's n_dims is outside `1..=GGML_MAX_DIMS` (4).
    #[error("tensor {tensor}: n_dims {n_dims} is outside 1..=4")]
    BadDims {
        /// The tensor's name.
        tensor: String,
        /// n_dims as read.
        n_dims: u32,
    },

    /// A tensor's element or byte count overflows (past `i64::MAX`, ggml's limit).
    #[error("tensor {tensor}: ne {ne:?} overflows the element or byte count")]
    ElementCountOverflow {
        /// The tensor's name.
        tensor: String,
        /// Its dimensions, innermost first.
        ne: Vec<u64>,
    },

    /// A ggml type id this reader does not know (see [`GgmlType`]).
    #[error("tensor {tensor}: unknown ggml type id {id}")]
    UnknownGgmlType {
        /// The tensor's name.
        tensor: String,
        /// The type id as read.
        id: u32,
    },

    /// A row (`ne[0]`) is not a whole number of the type's blocks.
    #[error("tensor {tensor}: row length ne[0] = {ne0} is not a multiple of the {ggml_type} block size {block_size}")]
    NotBlockMultiple {
        /// The tensor's name.
        tensor: String,
        /// Its type.
        ggml_type: GgmlType,
        /// Its row length.
        ne0: u64,
        /// The type's block size in elements.
        block_size: u64,
    },

    /// The same tensor name appears twice.
    #[error("duplicate tensor name {name:?}")]
    DuplicateTensor {
        /// The name.
        name: String,
    },

    /// A tensor's offset is not a multiple of `general.alignment`.
    #[error("tensor {tensor}: offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedOffset {
        /// The tensor's name.
        tensor: String,
        /// Its offset relative to the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u32,
    },

    /// A tensor's bytes lie (partly) past the end of the file.
    #[error("tensor {tensor}: {n_bytes} bytes at data offset {offset} run past the {data_len}-byte data section")]
    TensorOutOfBounds {
        /// The tensor's name.
        tensor: String,
        /// Its offset relative to the data section.
        offset: u64,
        /// Its size in bytes.
        n_bytes: u64,
        /// The data section's length (file length minus data offset).
        data_len: u64,
    },

    /// Two tensors share bytes.
    #[error("tensors {first} and {second} overlap in the data section")]
    OverlappingTensors {
        /// The tensor with the lower offset.
        first: String,
        /// The tensor that starts inside it.
        second: String,
    },

    /// Conversion asked of a type this reader does not dequantize.
    #[error("tensor {tensor} has type {ggml_type}; conversion supports F32, F16, BF16, Q8_0")]
    UnsupportedConversion {
        /// The tensor's name.
        tensor: String,
        /// Its type.
        ggml_type: GgmlType,
    },

    /// A [`crate::TensorInfo`] passed in that is not one of this file's.
    #[error("tensor {tensor} is not a tensor of this file")]
    ForeignTensor {
        /// The tensor's name.
        tensor: String,
    },

    /// A tensor asked for by name is not in the file.
    #[error("tensor {name} is not in the file")]
    MissingTensor {
        /// The name asked for.
        name: String,
    },

    /// A metadata key asked for is not in the file.
    #[error("metadata key {key:?} is missing")]
    MissingKey {
        /// The key asked for.
        key: String,
    },

    /// A metadata value has a type (or, for integers, a value) the getter cannot return.
    #[error("metadata key {key:?}: expected {expected}, found {found}")]
    WrongType {
        /// The key.
        key: String,
        /// What the getter returns, e.g. `u32`.
        expected: &'static str,
        /// What the file holds, e.g. `string` or `i64 -1`.
        found: String,
    },
}
