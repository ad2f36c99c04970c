//! Tests of `header.rs`.

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
