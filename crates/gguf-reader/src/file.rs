//! [`GgufFile`]: an opened, validated GGUF file and its accessors.

use std::fmt;
use std::fs::File;
use std::path::Path;

use half::bf16;
use memmap2::Mmap;

use crate::metadata::{MetaArray, MetaValue};
use crate::parse::{parse, Parsed};
use crate::{GgufError, TensorInfo, TensorView};

/// Where the file's bytes live.
enum Storage {
    Mmap(Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mmap(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// A parsed and validated GGUF v2/v3 file: metadata, tensor infos and the tensors' bytes.
///
/// All validation happens when the file is opened; afterwards accessors only index checked ranges.
pub struct GgufFile {
    storage: Storage,
    parsed: Parsed,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.parsed.version)
            .field("alignment", &self.parsed.alignment)
            .field("data_offset", &self.parsed.data_offset)
            .field("metadata", &self.parsed.metadata.len())
            .field("tensors", &self.parsed.tensors.len())
            .field("mmap", &matches!(self.storage, Storage::Mmap(_)))
            .finish()
    }
}

impl GgufFile {
    /// Memory-maps and parses the file at `path`.
    ///
    /// **Contract:** the file must not be modified or truncated while the returned value (or
    /// anything borrowed from it) lives: the bytes are read through the map, so a concurrent
    /// write changes tensors after validation, and a truncation makes later reads fault with
    /// SIGBUS. Use [`GgufFile::open_in_memory`] where that cannot be promised. (The same
    /// contract as `st_reader::Checkpoint::open`, safetensors' and candle's mmap loaders.)
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let io = |source| GgufError::Io {
            path: path.to_owned(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let storage = if len == 0 {
            // An empty map is not portable; an empty file is simply truncated.
            Storage::Owned(Vec::new())
        } else {
            // SAFETY: the map is read-only and private, and `GgufFile` only ever reads it. What
            // Rust cannot rule out is another process truncating or rewriting the file while it
            // is mapped (SIGBUS or torn reads); `open` documents that callers must not let that
            // happen.
            Storage::Mmap(unsafe { Mmap::map(&file) }.map_err(io)?)
        };
        Self::from_storage(storage)
    }

    /// Like [`GgufFile::open`] but reads the whole file into memory instead of mapping it.
    pub fn open_in_memory(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| GgufError::Io {
            path: path.to_owned(),
            source,
        })?;
        Self::from_bytes(bytes)
    }

    /// Parses a file held in memory (tests, fuzzing, files fetched over the network).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::from_storage(Storage::Owned(bytes))
    }

    fn from_storage(storage: Storage) -> Result<GgufFile, GgufError> {
        let parsed = parse(storage.bytes())?;
        Ok(GgufFile { storage, parsed })
    }

    /// The GGUF version: 2 or 3.
    pub fn version(&self) -> u32 {
        self.parsed.version
    }

    /// The data alignment: `general.alignment`, or 32 when absent.
    pub fn alignment(&self) -> u32 {
        self.parsed.alignment
    }

    /// Byte offset of the data section in the file (tensor offsets count from here).
    pub fn data_offset(&self) -> u64 {
        self.parsed.data_offset
    }

    /// The whole file's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.storage.bytes()
    }

    /// All metadata entries, in file order.
    pub fn metadata(&self) -> &[(String, MetaValue)] {
        &self.parsed.metadata
    }

    /// The value of metadata key `key`, if present.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        let i = *self.parsed.key_index.get(key)?;
        self.parsed.metadata.get(i).map(|(_, v)| v)
    }

    fn typed<'a, T>(
        &'a self,
        key: &str,
        expected: &'static str,
        pick: impl FnOnce(&'a MetaValue) -> Option<T>,
    ) -> Result<T, GgufError> {
        let value = self.get(key).ok_or_else(|| GgufError::MissingKey {
            key: key.to_owned(),
        })?;
        pick(value).ok_or_else(|| GgufError::WrongType {
            key: key.to_owned(),
            expected,
            found: value.describe(),
        })
    }

    /// A required integer key (any stored width) whose value fits in u32.
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        self.typed(key, "u32", MetaValue::as_u32)
    }

    /// A required integer key (any stored width) whose value fits in i32.
    pub fn get_i32(&self, key: &str) -> Result<i32, GgufError> {
        self.typed(key, "i32", MetaValue::as_i32)
    }

    /// A required integer key (any stored width) whose value fits in u64.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        self.typed(key, "u64", MetaValue::as_u64)
    }

    /// A required integer key (any stored width) whose value fits in i64.
    pub fn get_i64(&self, key: &str) -> Result<i64, GgufError> {
        self.typed(key, "i64", MetaValue::as_i64)
    }

    /// A required f32 key (an f64 is rounded to f32).
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        self.typed(key, "f32", MetaValue::as_f32)
    }

    /// A required f64 key (an f32 is widened).
    pub fn get_f64(&self, key: &str) -> Result<f64, GgufError> {
        self.typed(key, "f64", MetaValue::as_f64)
    }

    /// A required bool key.
    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        self.typed(key, "bool", MetaValue::as_bool)
    }

    /// A required string key.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        self.typed(key, "string", MetaValue::as_str)
    }

    /// A required array key, any element type.
    pub fn get_array(&self, key: &str) -> Result<&MetaArray, GgufError> {
        self.typed(key, "array", MetaValue::as_array)
    }

    /// A required array of f32 (or f64, rounded to f32).
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>, GgufError> {
        self.typed(key, "array of f32", |v| v.as_array()?.to_f32_vec())
    }

    /// A required array of integers (any width) that all fit in u32.
    pub fn get_u32_array(&self, key: &str) -> Result<Vec<u32>, GgufError> {
        self.typed(key, "array of u32", int_array)
    }

    /// A required array of integers (any width) that all fit in i32.
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>, GgufError> {
        self.typed(key, "array of i32", int_array)
    }

    /// A required array of integers (any width) that all fit in i64.
    pub fn get_i64_array(&self, key: &str) -> Result<Vec<i64>, GgufError> {
        self.typed(key, "array of i64", int_array)
    }

    /// A required array of strings.
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        self.typed(key, "array of string", |v| v.as_array()?.to_str_vec())
    }

    /// All tensor infos, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.parsed.tensors
    }

    /// The tensor named `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        let i = *self.parsed.tensor_index.get(name)?;
        self.parsed.tensors.get(i)
    }

    /// The tensor named `name`, or [`GgufError::MissingTensor`].
    pub fn require_tensor(&self, name: &str) -> Result<&TensorInfo, GgufError> {
        self.tensor(name).ok_or_else(|| GgufError::MissingTensor {
            name: name.to_owned(),
        })
    }

    /// The raw bytes of one of this file's tensors; empty for a [`TensorInfo`] of another file
    /// that does not fit in this one (use [`GgufFile::view`] to get an error instead).
    pub fn tensor_bytes(&self, info: &TensorInfo) -> &[u8] {
        self.byte_range(info).unwrap_or(&[])
    }

    fn byte_range(&self, info: &TensorInfo) -> Option<&[u8]> {
        let start = self.parsed.data_offset.checked_add(info.offset)?;
        let end = start.checked_add(info.n_bytes)?;
        let range = usize::try_from(start).ok()?..usize::try_from(end).ok()?;
        self.storage.bytes().get(range)
    }

    /// A typed view of one of this file's tensors; [`GgufError::ForeignTensor`] for any other.
    pub fn view<'a>(&'a self, info: &TensorInfo) -> Result<TensorView<'a>, GgufError> {
        let foreign = || GgufError::ForeignTensor {
            tensor: info.name.clone(),
        };
        let ours = self
            .tensor(&info.name)
            .filter(|t| *t == info)
            .ok_or_else(foreign)?;
        let bytes = self.byte_range(ours).ok_or_else(foreign)?;
        Ok(TensorView::new(ours, bytes))
    }

    /// The tensor's values as f32 (F32, F16, BF16, Q8_0; other types are refused by name).
    pub fn to_f32(&self, info: &TensorInfo) -> Result<Vec<f32>, GgufError> {
        self.view(info)?.to_f32()
    }

    /// The tensor's values as bf16 (F32, F16, BF16, Q8_0; other types are refused by name).
    pub fn to_bf16(&self, info: &TensorInfo) -> Result<Vec<bf16>, GgufError> {
        self.view(info)?.to_bf16()
    }
}

/// An integer array whose elements all convert to `T`.
fn int_array<T: TryFrom<i128>>(value: &MetaValue) -> Option<Vec<T>> {
    value
        .as_array()?
        .to_i128_vec()?
        .into_iter()
        .map(|x| T::try_from(x).ok())
        .collect()
}
