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
mod tests {
    use super::*;
    use crate::test_util::{assemble, expected_file, fixtures, split};
    use crate::Checkpoint;
    use serde_json::json;

    fn good() -> Vec<u8> {
        std::fs::read(fixtures().join("single.safetensors")).unwrap()
    }

    fn err(bytes: Vec<u8>) -> StError {
        match Checkpoint::from_bytes(bytes) {
            Ok(_) => panic!("malformed input accepted"),
            Err(e) => e,
        }
    }

    /// Re-assembles the good file after `edit` changes its header JSON.
    fn with_header(edit: impl FnOnce(&mut serde_json::Map<String, Value>)) -> Vec<u8> {
        let (header, data) = split(&good());
        let mut v: Value = serde_json::from_str(&header).unwrap();
        edit(v.as_object_mut().unwrap());
        assemble(v.to_string().as_bytes(), &data)
    }

    fn with_entry(name: &str, entry: Value) -> Vec<u8> {
        with_header(|h| {
            h.insert(name.into(), entry);
        })
    }

    #[test]
    fn good_file_matches_writer_header() {
        let bytes = good();
        let h = parse(&bytes, Path::new("single")).unwrap();
        let exp = expected_file("single.safetensors");
        assert_eq!(h.data_start as u64, 8 + exp["header_len"].as_u64().unwrap());
        assert_eq!(bytes.len() as u64, exp["file_len"].as_u64().unwrap());
        assert_eq!(h.tensors.len(), exp["tensors"].as_object().unwrap().len());
        for t in &h.tensors {
            let e = &exp["tensors"][&t.name];
            assert_eq!(t.dtype.as_str(), e["dtype"]);
            assert_eq!(json!(t.shape), e["shape"]);
            assert_eq!(
                json!([t.data_offsets.0, t.data_offsets.1]),
                e["data_offsets"]
            );
        }
        assert_eq!(json!(h.metadata), exp["metadata"]);
    }

    #[test]
    fn truncated_in_prefix_or_header() {
        let bytes = good();
        let data_start = parse(&bytes, Path::new("x")).unwrap().data_start;
        for cut in 0..data_start {
            match err(bytes[..cut].to_vec()) {
                StError::HeaderTooSmall { len, .. } if cut < 8 => assert_eq!(len, cut as u64),
                StError::InvalidHeaderLength { file_len, .. } if cut >= 8 => {
                    assert_eq!(file_len, cut as u64)
                }
                e => panic!("cut {cut}: {e:?}"),
            }
        }
    }

    #[test]
    fn truncated_in_data_at_every_byte_and_tensor_boundary() {
        let bytes = good();
        let h = parse(&bytes, Path::new("x")).unwrap();
        let data_len = bytes.len() - h.data_start;
        // Every cut inside the data, tensor boundaries included, leaves some tensor past the end.
        for cut in 0..data_len {
            let last_end = h.tensors.iter().map(|t| t.data_offsets.1).max().unwrap();
            match err(bytes[..h.data_start + cut].to_vec()) {
                StError::OffsetOutOfBounds {
                    end, data_len: d, ..
                } => {
                    assert!(end as usize > cut && end as usize <= last_end);
                    assert_eq!(d, cut as u64);
                }
                e => panic!("cut {cut}: {e:?}"),
            }
        }
        assert!(Checkpoint::from_bytes(bytes).is_ok());
    }

    #[test]
    fn header_length_out_of_range() {
        let bytes = good();
        let set_len = |n: u64| {
            let mut b = bytes.clone();
            b[..8].copy_from_slice(&n.to_le_bytes());
            b
        };
        let file_len = bytes.len() as u64;
        for n in [file_len - 7, file_len, MAX_HEADER_LEN, 0, 1] {
            assert!(
                matches!(err(set_len(n)), StError::InvalidHeaderLength { header_len, file_len: f, .. } if header_len == n && f == file_len),
                "n = {n}"
            );
        }
        for n in [MAX_HEADER_LEN + 1, u64::MAX] {
            assert!(
                matches!(err(set_len(n)), StError::HeaderTooLarge { header_len, .. } if header_len == n)
            );
        }
    }

    #[test]
    fn header_not_utf8() {
        let mut bytes = good();
        bytes[10] = 0xFF;
        assert!(
            matches!(err(bytes), StError::HeaderNotUtf8 { source, .. } if source.valid_up_to() == 2)
        );
    }

    #[test]
    fn header_bad_json() {
        for text in [&b"{\"a\":  "[..], b"{} x", b"{,}", b"  "] {
            assert!(
                matches!(err(assemble(text, &[])), StError::HeaderJson { .. }),
                "{:?}",
                text
            );
        }
    }

    #[test]
    fn header_not_an_object() {
        for (text, kind) in [
            ("[1, {}]", "array"),
            ("\"s\"", "string"),
            ("12", "number"),
            ("-1", "number"),
            ("1.5", "number"),
            ("null", "null"),
            ("true", "boolean"),
        ] {
            match err(assemble(text.as_bytes(), &[])) {
                StError::HeaderNotObject { found, .. } => assert_eq!(found, kind),
                e => panic!("{text}: {e:?}"),
            }
        }
    }

    fn entry_reason(bytes: Vec<u8>, tensor_name: &str) -> String {
        match err(bytes) {
            StError::InvalidTensorEntry { tensor, reason, .. } => {
                assert_eq!(tensor, tensor_name);
                reason
            }
            e => panic!("{e:?}"),
        }
    }

    #[test]
    fn missing_fields() {
        for field in ["dtype", "shape", "data_offsets"] {
            let bytes = with_header(|h| {
                h["u8"].as_object_mut().unwrap().remove(field);
            });
            assert_eq!(entry_reason(bytes, "u8"), format!("missing {field}"));
        }
        let bytes = with_entry("u8", json!([1, 2]));
        assert!(entry_reason(bytes, "u8").contains("expected an object"));
        let bytes = with_entry(
            "u8",
            json!({"dtype": 3, "shape": [5], "data_offsets": [80, 85]}),
        );
        assert!(entry_reason(bytes, "u8").contains("dtype is a number"));
    }

    #[test]
    fn bad_shapes() {
        for shape in [
            json!([-1]),
            json!([2.5, 2]),
            json!(["5"]),
            json!(5),
            json!([18446744073709551616u128 as f64]),
        ] {
            let bytes = with_entry(
                "u8",
                json!({"dtype": "U8", "shape": shape, "data_offsets": [80, 85]}),
            );
            assert!(entry_reason(bytes, "u8").contains("shape"), "{shape}");
        }
    }

    #[test]
    fn bad_data_offsets() {
        for offsets in [
            json!([80]),
            json!([80, 85, 90]),
            json!([-1, 85]),
            json!([80.0, 85]),
            json!("80,85"),
        ] {
            let bytes = with_entry(
                "u8",
                json!({"dtype": "U8", "shape": [5], "data_offsets": offsets}),
            );
            assert!(
                entry_reason(bytes, "u8").contains("data_offsets"),
                "{offsets}"
            );
        }
        let bytes = with_entry(
            "u8",
            json!({"dtype": "U8", "shape": [5], "data_offsets": [85, 80]}),
        );
        assert!(
            matches!(err(bytes), StError::ReversedOffsets { tensor, begin: 85, end: 80, .. } if tensor == "u8")
        );
        let bytes = with_entry(
            "u8",
            json!({"dtype": "U8", "shape": [5], "data_offsets": [81, 86]}),
        );
        assert!(
            matches!(err(bytes), StError::OffsetOutOfBounds { tensor, end: 86, data_len: 85, .. } if tensor == "u8")
        );
    }

    #[test]
    fn overlap_gap_and_uncovered_tail() {
        // Writer layout: i64 [0,24) f32 [24,60) bf16 [60,68) f16 [68,80) u8 [80,85).
        // Moving bf16 two bytes back overlaps f32.
        let bytes = with_entry(
            "bf16",
            json!({"dtype": "BF16", "shape": [2, 2], "data_offsets": [58, 66]}),
        );
        assert!(
            matches!(err(bytes), StError::OverlappingTensors { tensor, other, .. } if tensor == "bf16" && other == "f32")
        );
        // Same offsets twice.
        let bytes = with_entry(
            "u8",
            json!({"dtype": "U8", "shape": [12], "data_offsets": [68, 80]}),
        );
        assert!(
            matches!(err(bytes), StError::OverlappingTensors { tensor, other, .. } if tensor == "u8" && other == "f16")
        );
        // Drop the bf16 entry: its 8 bytes become a gap.
        let bytes = with_header(|h| {
            h.shift_remove("bf16");
        });
        assert!(
            matches!(err(bytes), StError::DataGap { tensor, expected: 60, begin: 68, .. } if tensor == "f16")
        );
        // Drop the first tensor: gap at the start.
        let bytes = with_header(|h| {
            h.shift_remove("i64");
        });
        assert!(
            matches!(err(bytes), StError::DataGap { tensor, expected: 0, begin: 24, .. } if tensor == "f32")
        );
        // Drop the last tensor, or append a byte: the tail is not covered.
        let bytes = with_header(|h| {
            h.shift_remove("u8");
        });
        assert!(matches!(
            err(bytes),
            StError::UncoveredTail {
                covered: 80,
                data_len: 85,
                ..
            }
        ));
        let mut bytes = good();
        bytes.push(0);
        assert!(matches!(
            err(bytes),
            StError::UncoveredTail {
                covered: 85,
                data_len: 86,
                ..
            }
        ));
    }

    #[test]
    fn numel_overflow() {
        let big = 1u64 << 40;
        let bytes = with_entry(
            "u8",
            json!({"dtype": "U8", "shape": [big, big], "data_offsets": [80, 85]}),
        );
        assert!(
            matches!(err(bytes), StError::ShapeOverflow { tensor, shape, .. } if tensor == "u8" && shape == [1 << 40, 1 << 40])
        );
        // numel fits but numel × 64 bits does not.
        let n = 1u64 << 60;
        let bytes = with_entry(
            "u8",
            json!({"dtype": "F64", "shape": [n], "data_offsets": [80, 85]}),
        );
        assert!(matches!(err(bytes), StError::ShapeOverflow { .. }));
        // Unknown dtypes still get the element-count check.
        let bytes = with_entry(
            "u8",
            json!({"dtype": "WEIRD", "shape": [big, big], "data_offsets": [80, 85]}),
        );
        assert!(matches!(err(bytes), StError::ShapeOverflow { .. }));
    }

    #[test]
    fn wrong_byte_size_for_dtype() {
        let bytes = with_entry(
            "u8",
            json!({"dtype": "U16", "shape": [5], "data_offsets": [80, 85]}),
        );
        match err(bytes) {
            StError::ByteSizeMismatch {
                tensor,
                dtype,
                shape,
                expected,
                found,
                ..
            } => {
                assert_eq!(
                    (tensor.as_str(), dtype.as_str(), shape, expected, found),
                    ("u8", "U16", vec![5], 10, 5)
                );
            }
            e => panic!("{e:?}"),
        }
        // A scalar (shape []) has one element.
        let bytes = with_entry(
            "u8",
            json!({"dtype": "U8", "shape": [], "data_offsets": [80, 85]}),
        );
        assert!(matches!(
            err(bytes),
            StError::ByteSizeMismatch {
                expected: 1,
                found: 5,
                ..
            }
        ));
    }

    #[test]
    fn sub_byte_dtypes() {
        // 5 × 4 bits = 20 bits: not a whole number of bytes (safetensors MisalignedSlice).
        let bytes = with_entry(
            "u8",
            json!({"dtype": "F4", "shape": [5], "data_offsets": [80, 85]}),
        );
        assert!(matches!(err(bytes), StError::MisalignedSubByte { dtype, .. } if dtype == "F4"));
        // 4 × 6 bits = 3 bytes: accepted.
        let (header, mut data) = split(&good());
        data.truncate(80);
        data.extend([1, 2, 3]);
        let mut h: Value = serde_json::from_str(&header).unwrap();
        h["u8"] = json!({"dtype": "F6_E2M3", "shape": [4], "data_offsets": [80, 83]});
        let ckpt = Checkpoint::from_bytes(assemble(h.to_string().as_bytes(), &data)).unwrap();
        assert_eq!(ckpt.tensor("u8").unwrap().bytes(), &[1, 2, 3]);
    }

    #[test]
    fn duplicate_names() {
        let (header, data) = split(&good());
        // serde_json would keep only the last entry; the reader must notice the repeat.
        let dup = header.trim_end().replacen(
            '{',
            "{\"u8\":{\"dtype\":\"U8\",\"shape\":[5],\"data_offsets\":[80,85]},",
            1,
        );
        assert!(
            matches!(err(assemble(dup.as_bytes(), &data)), StError::DuplicateKey { name, .. } if name == "u8")
        );
        let dup = header.trim_end().replacen('{', "{\"__metadata__\":{},", 1);
        assert!(
            matches!(err(assemble(dup.as_bytes(), &data)), StError::DuplicateKey { name, .. } if name == "__metadata__")
        );
    }

    #[test]
    fn metadata_shapes() {
        let bytes = with_entry("__metadata__", json!({"format": 1}));
        assert!(
            matches!(err(bytes), StError::InvalidMetadata { reason, .. } if reason.contains("`format`"))
        );
        let bytes = with_entry("__metadata__", json!(["pt"]));
        assert!(matches!(err(bytes), StError::InvalidMetadata { .. }));
        // null means absent, as safetensors' Option<HashMap> reads it.
        let ckpt = Checkpoint::from_bytes(with_entry("__metadata__", Value::Null)).unwrap();
        assert!(ckpt.metadata().is_empty());
    }

    #[test]
    fn unknown_dtype_keeps_bounds_and_overlap_checks() {
        let bytes = with_entry(
            "u8",
            json!({"dtype": "Q4_K_X", "shape": [7], "data_offsets": [80, 85]}),
        );
        let ckpt = Checkpoint::from_bytes(bytes).unwrap();
        assert_eq!(
            ckpt.tensor("u8").unwrap().dtype(),
            &Dtype::Other("Q4_K_X".into())
        );
        let bytes = with_entry(
            "u8",
            json!({"dtype": "Q4_K_X", "shape": [7], "data_offsets": [80, 90]}),
        );
        assert!(matches!(err(bytes), StError::OffsetOutOfBounds { .. }));
        let bytes = with_entry(
            "u8",
            json!({"dtype": "Q4_K_X", "shape": [7], "data_offsets": [79, 85]}),
        );
        assert!(matches!(err(bytes), StError::OverlappingTensors { .. }));
    }

    #[test]
    fn minimal_and_zero_sized() {
        let ckpt = Checkpoint::from_bytes(assemble(b"{}", &[])).unwrap();
        assert!(ckpt.is_empty());
        let text = r#"{"a":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]},"b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"c":{"dtype":"F16","shape":[0],"data_offsets":[1,1]}}"#;
        let ckpt = Checkpoint::from_bytes(assemble(text.as_bytes(), &[9])).unwrap();
        assert_eq!(ckpt.len(), 3);
        assert_eq!(
            ckpt.tensor("a").unwrap().to_f32().unwrap(),
            Vec::<f32>::new()
        );
    }

    #[test]
    fn extra_entry_fields_are_ignored() {
        // safetensors' serde TensorInfo ignores unknown fields; so do we.
        let bytes = with_entry(
            "u8",
            json!({"dtype": "U8", "shape": [5], "data_offsets": [80, 85], "note": 1}),
        );
        assert!(Checkpoint::from_bytes(bytes).is_ok());
    }
}
