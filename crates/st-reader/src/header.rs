//! Parsing and validating one safetensors file's header, following the rules of the
//! safetensors crate (`SafeTensors::read_metadata` and `Metadata::validate`).

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::Path;

use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use crate::error::MAX_HEADER_LEN;
use crate::{Dtype, StError};

/// Length of the little-endian `u64` header-length prefix.
pub(crate) const PREFIX_LEN: usize = 8;

/// One tensor entry of a validated header.
#[derive(Debug, Clone)]
pub(crate) struct RawTensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// `[begin, end)` relative to the data buffer.
    pub data_offsets: (usize, usize),
}

/// A validated header.
#[derive(Debug)]
pub(crate) struct Header {
    /// Offset of the data buffer in the file (8 + header length).
    pub data_start: usize,
    /// Tensors in file order.
    pub tensors: Vec<RawTensor>,
    /// The `__metadata__` map (empty when absent or `null`).
    pub metadata: BTreeMap<String, String>,
}

/// The top-level JSON value, keeping every object entry so duplicate keys can be seen
/// (`serde_json::Value` keeps only the last one).
enum Top {
    Object(Vec<(String, Value)>),
    NotObject(&'static str),
}

struct TopVisitor;

impl<'de> Visitor<'de> for TopVisitor {
    type Value = Top;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Top, A::Error> {
        let mut entries = Vec::new();
        while let Some((k, v)) = map.next_entry::<String, Value>()? {
            entries.push((k, v));
        }
        Ok(Top::Object(entries))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Top, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Top::NotObject("array"))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Top, E> {
        Ok(Top::NotObject("boolean"))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Top, E> {
        Ok(Top::NotObject("number"))
    }
    fn visit_u64<E>(self, _: u64) -> Result<Top, E> {
        Ok(Top::NotObject("number"))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Top, E> {
        Ok(Top::NotObject("number"))
    }
    fn visit_str<E>(self, _: &str) -> Result<Top, E> {
        Ok(Top::NotObject("string"))
    }
    fn visit_unit<E>(self) -> Result<Top, E> {
        Ok(Top::NotObject("null"))
    }
}

fn parse_top(text: &str) -> Result<Top, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(text);
    let top = (&mut de).deserialize_any(TopVisitor)?;
    de.end()?;
    Ok(top)
}

/// Parses and validates the header of `bytes` (a whole safetensors file). `file` is only used
/// in error messages.
pub(crate) fn parse(bytes: &[u8], file: &Path) -> Result<Header, StError> {
    let file_len = bytes.len() as u64;
    let Some(prefix) = bytes.first_chunk::<PREFIX_LEN>() else {
        return Err(StError::HeaderTooSmall {
            file: file.into(),
            len: file_len,
        });
    };
    let header_len = u64::from_le_bytes(*prefix);
    if header_len > MAX_HEADER_LEN {
        return Err(StError::HeaderTooLarge {
            file: file.into(),
            header_len,
        });
    }
    // `{}` is the shortest valid header; a length past the file's end is refused too.
    let bad_len = || StError::InvalidHeaderLength {
        file: file.into(),
        header_len,
        file_len,
    };
    if header_len < 2 {
        return Err(bad_len());
    }
    // header_len ≤ 1e8, so the sum cannot overflow usize on 64- or 32-bit targets.
    let data_start = PREFIX_LEN + header_len as usize;
    let header_bytes = bytes.get(PREFIX_LEN..data_start).ok_or_else(bad_len)?;
    let data_len = (bytes.len() - data_start) as u64;

    let text = std::str::from_utf8(header_bytes).map_err(|source| StError::HeaderNotUtf8 {
        file: file.into(),
        source,
    })?;
    let entries = match parse_top(text) {
        Ok(Top::Object(entries)) => entries,
        Ok(Top::NotObject(found)) => {
            return Err(StError::HeaderNotObject {
                file: file.into(),
                found,
            })
        }
        Err(source) => {
            return Err(StError::HeaderJson {
                file: file.into(),
                source,
            })
        }
    };

    let mut seen = HashSet::with_capacity(entries.len());
    let mut metadata = BTreeMap::new();
    let mut tensors = Vec::with_capacity(entries.len());
    for (name, value) in entries {
        if !seen.insert(name.clone()) {
            return Err(StError::DuplicateKey {
                file: file.into(),
                name,
            });
        }
        if name == "__metadata__" {
            metadata = parse_metadata(value, file)?;
        } else {
            tensors.push(parse_entry(name, value, data_len, file)?);
        }
    }
    check_layout(&tensors, data_len, file)?;
    Ok(Header {
        data_start,
        tensors,
        metadata,
    })
}

fn parse_metadata(value: Value, file: &Path) -> Result<BTreeMap<String, String>, StError> {
    let invalid = |reason: String| StError::InvalidMetadata {
        file: file.into(),
        reason,
    };
    match value {
        // safetensors deserializes `__metadata__` as `Option<HashMap<..>>`: null is "absent".
        Value::Null => Ok(BTreeMap::new()),
        Value::Object(map) => map
            .into_iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k, s)),
                other => Err(invalid(format!(
                    "value of `{k}` is a {}, expected a string",
                    kind(&other)
                ))),
            })
            .collect(),
        other => Err(invalid(format!(
            "is a {}, expected an object",
            kind(&other)
        ))),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// A JSON number as a non-negative integer that fits `usize`.
fn as_index(v: &Value) -> Option<usize> {
    v.as_u64().and_then(|n| usize::try_from(n).ok())
}

fn parse_entry(
    name: String,
    value: Value,
    data_len: u64,
    file: &Path,
) -> Result<RawTensor, StError> {
    let invalid = |name: &str, reason: String| StError::InvalidTensorEntry {
        file: file.into(),
        tensor: name.to_owned(),
        reason,
    };
    let Value::Object(map) = value else {
        return Err(invalid(
            &name,
            format!("entry is a {}, expected an object", kind(&value)),
        ));
    };
    let dtype = match map.get("dtype") {
        Some(Value::String(s)) => Dtype::parse(s),
        Some(other) => {
            return Err(invalid(
                &name,
                format!("dtype is a {}, expected a string", kind(other)),
            ))
        }
        None => return Err(invalid(&name, "missing dtype".into())),
    };
    let shape = match map.get("shape") {
        Some(Value::Array(dims)) => dims
            .iter()
            .map(|d| {
                as_index(d).ok_or_else(|| {
                    invalid(
                        &name,
                        format!("shape dimension {d} is not a non-negative integer"),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(other) => {
            return Err(invalid(
                &name,
                format!("shape is a {}, expected an array", kind(other)),
            ))
        }
        None => return Err(invalid(&name, "missing shape".into())),
    };
    let (begin, end) = match map.get("data_offsets") {
        Some(Value::Array(o)) => match o.as_slice() {
            [b, e] => match (as_index(b), as_index(e)) {
                (Some(b), Some(e)) => (b, e),
                _ => {
                    return Err(invalid(
                        &name,
                        format!("data_offsets [{b}, {e}] are not non-negative integers"),
                    ))
                }
            },
            _ => {
                return Err(invalid(
                    &name,
                    format!("data_offsets has {} elements, expected 2", o.len()),
                ))
            }
        },
        Some(other) => {
            return Err(invalid(
                &name,
                format!("data_offsets is a {}, expected an array", kind(other)),
            ))
        }
        None => return Err(invalid(&name, "missing data_offsets".into())),
    };
    if end < begin {
        return Err(StError::ReversedOffsets {
            file: file.into(),
            tensor: name,
            begin: begin as u64,
            end: end as u64,
        });
    }
    if end as u64 > data_len {
        return Err(StError::OffsetOutOfBounds {
            file: file.into(),
            tensor: name,
            end: end as u64,
            data_len,
        });
    }
    let Some(numel) = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) else {
        return Err(StError::ShapeOverflow {
            file: file.into(),
            tensor: name,
            shape,
        });
    };
    if let Some(bits) = dtype.bit_size() {
        let Some(nbits) = numel.checked_mul(bits) else {
            return Err(StError::ShapeOverflow {
                file: file.into(),
                tensor: name,
                shape,
            });
        };
        if nbits % 8 != 0 {
            return Err(StError::MisalignedSubByte {
                file: file.into(),
                tensor: name,
                dtype: dtype.as_str().to_owned(),
                shape,
            });
        }
        let expected = nbits / 8;
        if expected != end - begin {
            return Err(StError::ByteSizeMismatch {
                file: file.into(),
                tensor: name,
                dtype: dtype.as_str().to_owned(),
                shape,
                expected: expected as u64,
                found: (end - begin) as u64,
            });
        }
    }
    Ok(RawTensor {
        name,
        dtype,
        shape,
        data_offsets: (begin, end),
    })
}

/// Tensors sorted by offset must tile the data buffer exactly: no overlap, no gap, nothing
/// left over (safetensors `Metadata::validate` plus its `MetadataIncompleteBuffer` check).
fn check_layout(tensors: &[RawTensor], data_len: u64, file: &Path) -> Result<(), StError> {
    let mut order: Vec<&RawTensor> = tensors.iter().collect();
    order.sort_by(|a, b| {
        a.data_offsets
            .cmp(&b.data_offsets)
            .then_with(|| a.name.cmp(&b.name))
    });
    let mut cursor = 0usize;
    let mut prev: Option<&RawTensor> = None;
    for t in order {
        let (begin, end) = t.data_offsets;
        if begin < cursor {
            return Err(StError::OverlappingTensors {
                file: file.into(),
                tensor: t.name.clone(),
                other: prev.map_or_else(String::new, |p| p.name.clone()),
            });
        }
        if begin > cursor {
            return Err(StError::DataGap {
                file: file.into(),
                tensor: t.name.clone(),
                expected: cursor as u64,
                begin: begin as u64,
            });
        }
        cursor = end;
        prev = Some(t);
    }
    if cursor as u64 != data_len {
        return Err(StError::UncoveredTail {
            file: file.into(),
            covered: cursor as u64,
            data_len,
        });
    }
    Ok(())
}

/// The malformed corpus: every case is derived from the writer-made `single.safetensors`.
#[cfg(test)]
mod tests;
