//! The parser: header, metadata, tensor infos, then layout checks.
//!
//! Every count is checked against the bytes that remain before anything is allocated for it,
//! so no allocation is larger than a small multiple of the file's size.

use std::collections::HashMap;
use std::fmt;

use crate::metadata::{MetaArray, MetaValue, ValueType};
use crate::{GgmlType, GgufError, TensorInfo};

/// Longest metadata key or tensor name accepted, in bytes (ggml caps names far lower).
pub const MAX_KEY_LEN: u64 = 65_535;
/// Longest string value accepted, in bytes (16 MiB; chat templates are a few KiB).
pub const MAX_STRING_LEN: u64 = 16 << 20;
/// Deepest array nesting accepted (an array of arrays is 2 levels).
pub const MAX_ARRAY_DEPTH: usize = 8;
/// ggml `GGML_MAX_DIMS`: a tensor has 1 to 4 dimensions.
pub const GGML_MAX_DIMS: u32 = 4;
/// gguf `GGUF_DEFAULT_ALIGNMENT`: the data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u32 = 32;
/// The metadata key that sets the data alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";

/// Fewest bytes of a metadata entry: key length (8) + value type (4) + a one-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// Fewest bytes of a tensor info: name length (8) + n_dims (4) + one ne (8) + type (4) + offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 8 + 4 + 8;

/// Where the parser is, for error messages.
#[derive(Clone, Copy)]
enum At<'k> {
    Header,
    Entry(u64),
    Key(&'k str),
    TensorInfo(u64),
    Tensor(&'k str),
}

impl fmt::Display for At<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            At::Header => f.write_str("header"),
            At::Entry(i) => write!(f, "metadata entry #{i}"),
            At::Key(k) => write!(f, "metadata key {k:?}"),
            At::TensorInfo(i) => write!(f, "tensor info #{i}"),
            At::Tensor(n) => write!(f, "tensor info {n:?}"),
        }
    }
}

/// A reader over the file's bytes that never reads past the end.
struct Cursor<'a> {
    rest: &'a [u8],
    offset: u64,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        self.rest.len() as u64
    }

    fn truncated(&self, at: At<'_>, field: &'static str, needed: u64) -> GgufError {
        GgufError::Truncated {
            location: at.to_string(),
            field,
            offset: self.offset,
            needed,
            available: self.remaining(),
        }
    }

    fn take(&mut self, n: u64, at: At<'_>, field: &'static str) -> Result<&'a [u8], GgufError> {
        let split = usize::try_from(n)
            .ok()
            .and_then(|n| self.rest.split_at_checked(n));
        let Some((head, tail)) = split else {
            return Err(self.truncated(at, field, n));
        };
        self.rest = tail;
        self.offset += n;
        Ok(head)
    }

    fn chunk<const N: usize>(
        &mut self,
        at: At<'_>,
        field: &'static str,
    ) -> Result<[u8; N], GgufError> {
        let Some((head, tail)) = self.rest.split_first_chunk::<N>() else {
            return Err(self.truncated(at, field, N as u64));
        };
        self.rest = tail;
        self.offset += N as u64;
        Ok(*head)
    }

    fn u32(&mut self, at: At<'_>, field: &'static str) -> Result<u32, GgufError> {
        self.chunk(at, field).map(u32::from_le_bytes)
    }

    fn u64(&mut self, at: At<'_>, field: &'static str) -> Result<u64, GgufError> {
        self.chunk(at, field).map(u64::from_le_bytes)
    }

    /// Checks that `count` items of at least `min_size` bytes each can fit in what remains.
    fn count(
        &self,
        count: u64,
        min_size: u64,
        at: At<'_>,
        field: &'static str,
    ) -> Result<usize, GgufError> {
        match count.checked_mul(min_size) {
            Some(bytes) if bytes <= self.remaining() => usize::try_from(count).ok(),
            _ => None,
        }
        .ok_or_else(|| GgufError::CountTooLarge {
            location: at.to_string(),
            field,
            count,
            min_size,
            available: self.remaining(),
        })
    }

    /// A u64 length then that many bytes, refusing lengths over `max` before reading them.
    fn string_bytes(
        &mut self,
        max: u64,
        at: At<'_>,
        field: &'static str,
    ) -> Result<&'a [u8], GgufError> {
        let len = self.u64(at, field)?;
        if len > max {
            return Err(GgufError::StringTooLong {
                location: at.to_string(),
                field,
                len,
                max,
            });
        }
        self.take(len, at, field)
    }

    /// A key or tensor name: at most [`MAX_KEY_LEN`] bytes of valid UTF-8.
    fn name(&mut self, at: At<'_>, field: &'static str) -> Result<String, GgufError> {
        let bytes = self.string_bytes(MAX_KEY_LEN, at, field)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(GgufError::InvalidUtf8 {
                location: at.to_string(),
                field,
            }),
        }
    }

    fn string_value(&mut self, at: At<'_>) -> Result<String, GgufError> {
        let bytes = self.string_bytes(MAX_STRING_LEN, at, "string value")?;
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }

    fn value_type(&mut self, at: At<'_>, field: &'static str) -> Result<ValueType, GgufError> {
        let id = self.u32(at, field)?;
        ValueType::from_id(id).ok_or_else(|| GgufError::UnknownValueType {
            location: at.to_string(),
            id,
        })
    }

    fn bool_byte(byte: u8, at: At<'_>) -> Result<bool, GgufError> {
        match byte {
            0 => Ok(false),
            1 => Ok(true),
            byte => Err(GgufError::InvalidBool {
                location: at.to_string(),
                byte,
            }),
        }
    }

    /// One value of type `ty`; `depth` is the number of arrays it sits in.
    fn value(&mut self, ty: ValueType, at: At<'_>, depth: usize) -> Result<MetaValue, GgufError> {
        Ok(match ty {
            ValueType::U8 => MetaValue::U8(u8::from_le_bytes(self.chunk(at, "u8 value")?)),
            ValueType::I8 => MetaValue::I8(i8::from_le_bytes(self.chunk(at, "i8 value")?)),
            ValueType::U16 => MetaValue::U16(u16::from_le_bytes(self.chunk(at, "u16 value")?)),
            ValueType::I16 => MetaValue::I16(i16::from_le_bytes(self.chunk(at, "i16 value")?)),
            ValueType::U32 => MetaValue::U32(u32::from_le_bytes(self.chunk(at, "u32 value")?)),
            ValueType::I32 => MetaValue::I32(i32::from_le_bytes(self.chunk(at, "i32 value")?)),
            ValueType::F32 => MetaValue::F32(f32::from_le_bytes(self.chunk(at, "f32 value")?)),
            ValueType::U64 => MetaValue::U64(u64::from_le_bytes(self.chunk(at, "u64 value")?)),
            ValueType::I64 => MetaValue::I64(i64::from_le_bytes(self.chunk(at, "i64 value")?)),
            ValueType::F64 => MetaValue::F64(f64::from_le_bytes(self.chunk(at, "f64 value")?)),
            ValueType::Bool => {
                let [byte] = self.chunk(at, "bool value")?;
                MetaValue::Bool(Self::bool_byte(byte, at)?)
            }
            ValueType::String => MetaValue::String(self.string_value(at)?),
            ValueType::Array => MetaValue::Array(self.array(at, depth + 1)?),
        })
    }

    /// An array body (element type, count, elements) at nesting level `depth` (1 = outermost).
    fn array(&mut self, at: At<'_>, depth: usize) -> Result<MetaArray, GgufError> {
        if depth > MAX_ARRAY_DEPTH {
            return Err(GgufError::NestingTooDeep {
                location: at.to_string(),
                max: MAX_ARRAY_DEPTH,
            });
        }
        let elem = self.value_type(at, "array element type")?;
        let count = self.u64(at, "array length")?;
        let size = elem.min_encoded_size();
        let n = self.count(count, size, at, "array length")?;

        /// Reads `n` fixed-size little-endian numbers in one slice.
        macro_rules! numbers {
            ($variant:ident, $t:ty, $w:literal) => {{
                let bytes = self.take(n as u64 * $w, at, "array elements")?;
                let (words, _) = bytes.as_chunks::<$w>();
                words
                    .iter()
                    .map(|&w| MetaValue::$variant(<$t>::from_le_bytes(w)))
                    .collect()
            }};
        }
        let values: Vec<MetaValue> = match elem {
            ValueType::U8 => numbers!(U8, u8, 1),
            ValueType::I8 => numbers!(I8, i8, 1),
            ValueType::U16 => numbers!(U16, u16, 2),
            ValueType::I16 => numbers!(I16, i16, 2),
            ValueType::U32 => numbers!(U32, u32, 4),
            ValueType::I32 => numbers!(I32, i32, 4),
            ValueType::F32 => numbers!(F32, f32, 4),
            ValueType::U64 => numbers!(U64, u64, 8),
            ValueType::I64 => numbers!(I64, i64, 8),
            ValueType::F64 => numbers!(F64, f64, 8),
            ValueType::Bool => {
                let bytes = self.take(n as u64, at, "array elements")?;
                bytes
                    .iter()
                    .map(|&b| Self::bool_byte(b, at).map(MetaValue::Bool))
                    .collect::<Result<_, _>>()?
            }
            ValueType::String => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(MetaValue::String(self.string_value(at)?));
                }
                v
            }
            ValueType::Array => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(MetaValue::Array(self.array(at, depth + 1)?));
                }
                v
            }
        };
        Ok(MetaArray::new(elem, values))
    }
}

/// Everything the parser learns from a file's bytes.
pub(crate) struct Parsed {
    pub version: u32,
    pub alignment: u32,
    pub data_offset: u64,
    pub metadata: Vec<(String, MetaValue)>,
    pub key_index: HashMap<String, usize>,
    pub tensors: Vec<TensorInfo>,
    pub tensor_index: HashMap<String, usize>,
}

/// Parses and validates a whole GGUF file held in `bytes`.
pub(crate) fn parse(bytes: &[u8]) -> Result<Parsed, GgufError> {
    let mut cur = Cursor {
        rest: bytes,
        offset: 0,
    };
    let at = At::Header;

    let magic_prefix = bytes.get(..4).unwrap_or(bytes);
    if !b"GGUF".starts_with(magic_prefix) {
        return Err(GgufError::BadMagic {
            found: magic_prefix.to_vec(),
        });
    }
    cur.chunk::<4>(at, "magic")?;
    let version = cur.u32(at, "version")?;
    match version {
        2 | 3 => {}
        v if matches!(v.swap_bytes(), 2 | 3) => return Err(GgufError::BigEndian { version }),
        version => return Err(GgufError::UnsupportedVersion { version }),
    }
    let tensor_count = cur.u64(at, "tensor count")?;
    let kv_count = cur.u64(at, "metadata count")?;
    let n_kv = cur.count(kv_count, MIN_KV_BYTES, at, "metadata count")?;
    let n_tensors = cur.count(tensor_count, MIN_TENSOR_INFO_BYTES, at, "tensor count")?;
    // Both tables share the remaining bytes.
    let both = (n_kv as u64 * MIN_KV_BYTES).checked_add(n_tensors as u64 * MIN_TENSOR_INFO_BYTES);
    if both.is_none_or(|b| b > cur.remaining()) {
        return Err(GgufError::CountTooLarge {
            location: at.to_string(),
            field: "tensor count",
            count: tensor_count,
            min_size: MIN_TENSOR_INFO_BYTES,
            available: cur.remaining().saturating_sub(n_kv as u64 * MIN_KV_BYTES),
        });
    }

    let mut metadata = Vec::with_capacity(n_kv);
    let mut key_index = HashMap::with_capacity(n_kv);
    for i in 0..n_kv {
        let key = cur.name(At::Entry(i as u64), "key")?;
        if key_index.contains_key(&key) {
            return Err(GgufError::DuplicateKey { key });
        }
        let at = At::Key(&key);
        let ty = cur.value_type(at, "value type")?;
        let value = cur.value(ty, at, 0)?;
        key_index.insert(key.clone(), i);
        metadata.push((key, value));
    }

    let alignment = match key_index
        .get(ALIGNMENT_KEY)
        .and_then(|&i| metadata.get(i))
        .map(|(_, v)| v)
    {
        None => DEFAULT_ALIGNMENT,
        Some(MetaValue::U32(a)) if a.is_power_of_two() => *a,
        Some(MetaValue::U32(a)) => {
            return Err(GgufError::BadAlignment {
                found: a.to_string(),
            })
        }
        Some(other) => {
            return Err(GgufError::BadAlignment {
                found: format!("a {} value", other.type_name()),
            })
        }
    };

    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(n_tensors);
    let mut tensor_index = HashMap::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let name = cur.name(At::TensorInfo(i as u64), "tensor name")?;
        if tensor_index.contains_key(&name) {
            return Err(GgufError::DuplicateTensor { name });
        }
        let info = tensor_info(&mut cur, name)?;
        tensor_index.insert(info.name.clone(), i);
        tensors.push(info);
    }

    // The data section starts at the end of the tensor infos, rounded up to the alignment.
    let header_end = cur.offset;
    let data_offset = header_end.div_ceil(u64::from(alignment)) * u64::from(alignment);
    let data_len = (bytes.len() as u64).saturating_sub(data_offset);
    check_layout(&tensors, alignment, data_len)?;

    Ok(Parsed {
        version,
        alignment,
        data_offset,
        metadata,
        key_index,
        tensors,
        tensor_index,
    })
}

/// The rest of one tensor info after its name: n_dims, ne, type, offset; sizes checked.
fn tensor_info(cur: &mut Cursor<'_>, name: String) -> Result<TensorInfo, GgufError> {
    let at = At::Tensor(&name);
    let n_dims = cur.u32(at, "n_dims")?;
    if n_dims == 0 || n_dims > GGML_MAX_DIMS {
        return Err(GgufError::BadDims {
            tensor: name,
            n_dims,
        });
    }
    let mut ne = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        ne.push(cur.u64(at, "ne")?);
    }
    let type_id = cur.u32(at, "ggml type")?;
    let offset = cur.u64(at, "offset")?;

    let Some(ggml_type) = GgmlType::from_id(type_id) else {
        return Err(GgufError::UnknownGgmlType {
            tensor: name,
            id: type_id,
        });
    };
    // ggml refuses element counts past INT64_MAX; so do we, and byte counts likewise.
    let n_elements = ne
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= i64::MAX as u64);
    let Some(n_elements) = n_elements else {
        return Err(GgufError::ElementCountOverflow { tensor: name, ne });
    };
    let block_size = u64::from(ggml_type.block_size());
    let ne0 = ne.first().copied().unwrap_or(0);
    if ne0 % block_size != 0 {
        return Err(GgufError::NotBlockMultiple {
            tensor: name,
            ggml_type,
            ne0,
            block_size,
        });
    }
    let n_bytes = (n_elements / block_size)
        .checked_mul(u64::from(ggml_type.type_size()))
        .filter(|&n| n <= i64::MAX as u64);
    let Some(n_bytes) = n_bytes else {
        return Err(GgufError::ElementCountOverflow { tensor: name, ne });
    };
    Ok(TensorInfo {
        name,
        ggml_type,
        ne,
        offset,
        n_bytes,
    })
}

/// Offsets aligned, bytes inside the data section, no two tensors sharing a byte.
fn check_layout(tensors: &[TensorInfo], alignment: u32, data_len: u64) -> Result<(), GgufError> {
    for t in tensors {
        if t.offset % u64::from(alignment) != 0 {
            return Err(GgufError::MisalignedOffset {
                tensor: t.name.clone(),
                offset: t.offset,
                alignment,
            });
        }
        if t.offset
            .checked_add(t.n_bytes)
            .is_none_or(|end| end > data_len)
        {
            return Err(GgufError::TensorOutOfBounds {
                tensor: t.name.clone(),
                offset: t.offset,
                n_bytes: t.n_bytes,
                data_len,
            });
        }
    }
    // Sort non-empty tensors by offset; each must start at or after the furthest end so far.
    let mut order: Vec<&TensorInfo> = tensors.iter().filter(|t| t.n_bytes > 0).collect();
    order.sort_by_key(|t| t.offset);
    let mut furthest: Option<&TensorInfo> = None;
    for t in order {
        if let Some(prev) = furthest {
            if t.offset < prev.offset + prev.n_bytes {
                return Err(GgufError::OverlappingTensors {
                    first: prev.name.clone(),
                    second: t.name.clone(),
                });
            }
        }
        if furthest.is_none_or(|p| t.offset + t.n_bytes > p.offset + p.n_bytes) {
            furthest = Some(t);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_checked_against_remaining_bytes_without_overflow() {
        let cur = Cursor {
            rest: &[0; 100],
            offset: 24,
        };
        assert_eq!(cur.count(7, 13, At::Header, "n").unwrap(), 7);
        assert!(cur.count(8, 13, At::Header, "n").is_err());
        assert!(cur.count(1 << 60, 13, At::Header, "n").is_err());
        assert!(cur.count(u64::MAX, 12, At::Header, "n").is_err());
        assert_eq!(
            cur.count(u64::MAX, 0, At::Header, "n").ok(),
            usize::try_from(u64::MAX).ok()
        );
    }

    #[test]
    fn reads_past_the_end_are_truncation_errors() {
        let mut cur = Cursor {
            rest: &[1, 0, 0],
            offset: 40,
        };
        let err = cur.u32(At::Entry(2), "value type").unwrap_err();
        assert_eq!(
            err.to_string(),
            "truncated file: metadata entry #2: value type needs 4 bytes at offset 40, only 3 remain"
        );
        assert!(cur.take(u64::MAX, At::Header, "x").is_err());
        assert_eq!(cur.take(3, At::Header, "x").unwrap(), &[1, 0, 0]);
    }
}
