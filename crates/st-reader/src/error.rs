//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong opening or reading a safetensors checkpoint.
///
/// `file` fields name the file at fault (`<memory>` for [`crate::Checkpoint::from_bytes`]);
/// `tensor` fields name the tensor as spelled in the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StError {
    /// An I/O operation on `path` failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory being read.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The path given to [`crate::Checkpoint::open`] does not exist.
    #[error("{path}: no such file or directory")]
    NotFound {
        /// The path as given.
        path: PathBuf,
    },
    /// A directory holds no `model.safetensors`, no `model.safetensors.index.json` and no
    /// `*.safetensors` file.
    #[error("{dir}: no model.safetensors, model.safetensors.index.json or *.safetensors file")]
    NoCheckpoint {
        /// The directory searched.
        dir: PathBuf,
    },
    /// A directory without `model.safetensors` or an index holds several `*.safetensors` files,
    /// so which one to open is ambiguous.
    #[error("{dir}: several .safetensors files and no model.safetensors.index.json: {files:?}")]
    AmbiguousDirectory {
        /// The directory searched.
        dir: PathBuf,
        /// The candidate file names, sorted.
        files: Vec<String>,
    },
    /// The file is shorter than the 8-byte header-length prefix.
    #[error("{file}: {len} bytes, too short for the 8-byte header length")]
    HeaderTooSmall {
        /// The file.
        file: PathBuf,
        /// Its length in bytes.
        len: u64,
    },
    /// The header length exceeds the 100 MB limit of the safetensors format.
    #[error("{file}: header length {header_len} exceeds the {MAX_HEADER_LEN}-byte limit")]
    HeaderTooLarge {
        /// The file.
        file: PathBuf,
        /// The header length the file declares.
        header_len: u64,
    },
    /// The header length is shorter than the smallest JSON object (`{}`) or runs past the end of
    /// the file.
    #[error("{file}: header length {header_len} invalid for a file of {file_len} bytes")]
    InvalidHeaderLength {
        /// The file.
        file: PathBuf,
        /// The header length the file declares.
        header_len: u64,
        /// The file's length in bytes.
        file_len: u64,
    },
    /// The header bytes are not UTF-8.
    #[error("{file}: header is not UTF-8: {source}")]
    HeaderNotUtf8 {
        /// The file.
        file: PathBuf,
        /// Where decoding failed.
        #[source]
        source: std::str::Utf8Error,
    },
    /// The header is not valid JSON.
    #[error("{file}: header is not valid JSON: {source}")]
    HeaderJson {
        /// The file.
        file: PathBuf,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// The header is valid JSON but not an object.
    #[error("{file}: header is a JSON {found}, expected an object")]
    HeaderNotObject {
        /// The file.
        file: PathBuf,
        /// The JSON kind found (`array`, `string`, ...).
        found: &'static str,
    },
    /// The header names the same key twice (a tensor or `__metadata__`).
    #[error("{file}: header names `{name}` twice")]
    DuplicateKey {
        /// The file.
        file: PathBuf,
        /// The repeated key.
        name: String,
    },
    /// `__metadata__` is not a map of strings to strings.
    #[error("{file}: __metadata__ {reason}")]
    InvalidMetadata {
        /// The file.
        file: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A tensor entry lacks a field or has one of the wrong type (e.g. a negative or fractional
    /// dimension in `shape`).
    #[error("{file}: tensor `{tensor}`: {reason}")]
    InvalidTensorEntry {
        /// The file.
        file: PathBuf,
        /// The tensor.
        tensor: String,
        /// What is wrong with the entry.
        reason: String,
    },
    /// A tensor's `data_offsets` end before they begin.
    #[error("{file}: tensor `{tensor}`: data_offsets [{begin}, {end}] are reversed")]
    ReversedOffsets {
        /// The file.
        file: PathBuf,
        /// The tensor.
        tensor: String,
        /// First offset.
        begin: u64,
        /// Second offset.
        end: u64,
    },
    /// A tensor's data runs past the end of the data buffer.
    #[error("{file}: tensor `{tensor}`: data ends at {end}, past the {data_len}-byte data buffer")]
    OffsetOutOfBounds {
        /// The file.
        file: PathBuf,
        /// The tensor.
        tensor: String,
        /// The end offset the header declares.
        end: u64,
        /// The length of the data buffer (file length − 8 − header length).
        data_len: u64,
    },
    /// The element count (or bit count) of a shape overflows `usize`.
    #[error("{file}: tensor `{tensor}`: element count of shape {shape:?} overflows")]
    ShapeOverflow {
        /// The file.
        file: PathBuf,
        /// The tensor.
        tensor: String,
        /// The shape declared.
        shape: Vec<usize>,
    },
    /// A sub-byte dtype's tensor does not fill a whole number of bytes.
    #[error("{file}: tensor `{tensor}`: {dtype} shape {shape:?} does not end on a byte boundary")]
    MisalignedSubByte {
        /// The file.
        file: PathBuf,
        /// The tensor.
        tensor: String,
        /// The dtype spelling.
        dtype: String,
        /// The shape declared.
        shape: Vec<usize>,
    },
    /// A tensor's byte range does not match its dtype and shape.
    #[error("{file}: tensor `{tensor}`: {dtype} shape {shape:?} needs {expected} bytes, data_offsets give {found}")]
    ByteSizeMismatch {
        /// The file.
        file: PathBuf,
        /// The tensor.
        tensor: String,
        /// The dtype spelling.
        dtype: String,
        /// The shape declared.
        shape: Vec<usize>,
        /// Bytes implied by dtype and shape.
        expected: u64,
        /// Bytes the offsets span.
        found: u64,
    },
    /// Two tensors' byte ranges overlap.
    #[error("{file}: tensor `{tensor}` overlaps tensor `{other}`")]
    OverlappingTensors {
        /// The file.
        file: PathBuf,
        /// The later tensor (by offset).
        tensor: String,
        /// The earlier tensor it overlaps.
        other: String,
    },
    /// Bytes between two tensors (or before the first) belong to no tensor.
    #[error("{file}: tensor `{tensor}` starts at {begin}, leaving unused bytes from {expected}")]
    DataGap {
        /// The file.
        file: PathBuf,
        /// The tensor after the gap.
        tensor: String,
        /// Where the previous tensor ended (where this one should begin).
        expected: u64,
        /// Where this tensor begins.
        begin: u64,
    },
    /// The tensors do not reach the end of the data buffer.
    #[error("{file}: tensors cover {covered} of {data_len} data bytes")]
    UncoveredTail {
        /// The file.
        file: PathBuf,
        /// Bytes covered by tensors.
        covered: u64,
        /// The length of the data buffer.
        data_len: u64,
    },
    /// A JSON side file (`config.json`, an index, ...) could not be parsed.
    #[error("{path}: invalid JSON: {source}")]
    InvalidJson {
        /// The file.
        path: PathBuf,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// A JSON side file is larger than the cap for it.
    #[error("{path}: {size} bytes, above the {limit}-byte cap")]
    FileTooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// The cap that applies.
        limit: u64,
    },
    /// The shard index is valid JSON but not shaped as transformers writes it.
    #[error("{path}: {reason}")]
    InvalidIndex {
        /// The index file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A shard or side-file name is not a plain file name inside the model directory
    /// (absolute, `..`, or containing a path separator).
    #[error("{index}: shard name {name:?} is not a plain file name inside the directory")]
    UnsafeFileName {
        /// The index (or caller) that gave the name.
        index: PathBuf,
        /// The name.
        name: String,
    },
    /// The index names a shard file that does not exist.
    #[error("{index}: shard {shard:?} does not exist")]
    MissingShard {
        /// The index file.
        index: PathBuf,
        /// The shard file name.
        shard: String,
    },
    /// A shard holds a tensor the index does not list.
    #[error("shard {shard:?} holds tensor `{tensor}`, which the index does not list")]
    TensorNotInIndex {
        /// The tensor.
        tensor: String,
        /// The shard file name.
        shard: String,
    },
    /// The index routes a tensor to a shard that does not hold it.
    #[error("index routes tensor `{tensor}` to shard {expected:?}, which does not hold it{}", found.as_ref().map(|f| format!(" (found in {f:?})")).unwrap_or_default())]
    TensorNotInShard {
        /// The tensor.
        tensor: String,
        /// The shard the index names.
        expected: String,
        /// The shard that does hold it, if any.
        found: Option<String>,
    },
    /// Two shards hold a tensor of the same name.
    #[error("tensor `{tensor}` is in both shard {first:?} and shard {second:?}")]
    TensorInTwoShards {
        /// The tensor.
        tensor: String,
        /// The first shard (in shard order).
        first: String,
        /// The second shard.
        second: String,
    },
    /// No tensor matches a lookup.
    #[error("no tensor named `{name}` (tried {tried:?})")]
    TensorNotFound {
        /// The name asked for.
        name: String,
        /// The spellings tried.
        tried: Vec<String>,
    },
    /// A lookup matches more than one tensor.
    #[error("`{name}` is ambiguous: the checkpoint has {candidates:?}")]
    AmbiguousName {
        /// The name asked for.
        name: String,
        /// The tensors it matches, sorted.
        candidates: Vec<String>,
    },
    /// A tensor's dtype cannot be converted to the requested type.
    #[error(
        "tensor `{tensor}`: cannot convert {dtype} to {target} (only BF16, F16 and F32 convert)"
    )]
    UnsupportedConversion {
        /// The tensor.
        tensor: String,
        /// The tensor's dtype spelling.
        dtype: String,
        /// The requested type (`f32` or `bf16`).
        target: &'static str,
    },
}

/// safetensors `MAX_HEADER_SIZE` (`safetensors/src/tensor.rs`): a header may be at most 100 MB.
pub const MAX_HEADER_LEN: u64 = 100_000_000;
