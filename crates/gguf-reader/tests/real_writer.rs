//! Files written by the real writer (gguf-py 0.19.0, `fixtures/readers/make_gguf.py`), checked
//! against `expected.json`: what the writer put in and what gguf-py computes from it.

use std::path::PathBuf;

use gguf_reader::{GgmlType, GgufError, GgufFile, MetaArray, MetaValue, ValueType};
use serde_json::{json, Value};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/readers/gguf")
        .join(name)
}

fn expected() -> Value {
    let text = std::fs::read_to_string(fixture("expected.json")).expect("expected.json");
    serde_json::from_str(&text).expect("valid JSON")
}

/// A value in expected.json's shape: `{type, value}` or `{type: array, elem_type, values}`.
fn value_json(v: &MetaValue) -> Value {
    match v {
        MetaValue::Array(a) => array_json(a),
        MetaValue::U8(x) => json!({"type": "u8", "value": x}),
        MetaValue::I8(x) => json!({"type": "i8", "value": x}),
        MetaValue::U16(x) => json!({"type": "u16", "value": x}),
        MetaValue::I16(x) => json!({"type": "i16", "value": x}),
        MetaValue::U32(x) => json!({"type": "u32", "value": x}),
        MetaValue::I32(x) => json!({"type": "i32", "value": x}),
        MetaValue::U64(x) => json!({"type": "u64", "value": x}),
        MetaValue::I64(x) => json!({"type": "i64", "value": x}),
        MetaValue::F32(x) => json!({"type": "f32", "value": f64::from(*x)}),
        MetaValue::F64(x) => json!({"type": "f64", "value": x}),
        MetaValue::Bool(x) => json!({"type": "bool", "value": x}),
        MetaValue::String(x) => json!({"type": "string", "value": x}),
    }
}

fn array_json(a: &MetaArray) -> Value {
    let values: Vec<Value> = a.iter().map(value_json).collect();
    json!({"type": "array", "elem_type": a.elem_type().name(), "values": values})
}

fn u64s(v: &Value) -> Vec<u64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("u64"))
        .collect()
}

fn check_file(file: &GgufFile, exp: &Value) {
    let name = exp["file"].as_str().unwrap();
    assert_eq!(
        u64::from(file.version()),
        exp["version"].as_u64().unwrap(),
        "{name}"
    );
    assert_eq!(
        u64::from(file.alignment()),
        exp["alignment"].as_u64().unwrap(),
        "{name}"
    );
    assert_eq!(
        file.data_offset(),
        exp["data_offset"].as_u64().unwrap(),
        "{name}"
    );

    // Metadata: same keys, same order, same types and values.
    let meta = exp["metadata"].as_array().unwrap();
    assert_eq!(file.metadata().len(), meta.len(), "{name}");
    for ((key, value), want) in file.metadata().iter().zip(meta) {
        assert_eq!(key, want["key"].as_str().unwrap(), "{name}");
        let mut want = want.clone();
        want.as_object_mut().unwrap().remove("key");
        assert_eq!(value_json(value), want, "{name}: {key}");
        assert_eq!(value.type_name(), want["type"].as_str().unwrap());
        assert_eq!(file.get(key), Some(value));
    }

    // Tensors: layout as gguf-py's reader sees it, values as gguf-py computes them.
    let tensors = exp["tensors"].as_array().unwrap();
    assert_eq!(file.tensors().len(), tensors.len(), "{name}");
    for (t, want) in file.tensors().iter().zip(tensors) {
        let tname = want["name"].as_str().unwrap();
        assert_eq!(t.name, tname);
        assert_eq!(file.tensor(tname), Some(t));
        assert_eq!(t.ggml_type.name(), want["ggml_type"].as_str().unwrap());
        assert_eq!(t.ne, u64s(&want["ne"]), "{tname}");
        assert_eq!(t.n_bytes, want["n_bytes"].as_u64().unwrap(), "{tname}");
        assert_eq!(
            file.data_offset() + t.offset,
            want["abs_offset"].as_u64().unwrap()
        );
        assert_eq!(file.tensor_bytes(t).len() as u64, t.n_bytes);
        let Some(f32s) = want.get("f32") else {
            let err = file.to_f32(t).unwrap_err();
            assert!(
                matches!(err, GgufError::UnsupportedConversion { .. }),
                "{err}"
            );
            continue;
        };
        assert_eq!(t.shape(), u64s(&want["shape"]), "{tname}");
        let got = file.to_f32(t).unwrap();
        let want_f32: Vec<u32> = f32s
            .as_array()
            .unwrap()
            .iter()
            .map(|x| (x.as_f64().unwrap() as f32).to_bits())
            .collect();
        let got_bits: Vec<u32> = got.iter().map(|x| x.to_bits()).collect();
        assert_eq!(got_bits, want_f32, "{tname} f32");
        assert_eq!(t.n_elements(), got.len() as u64);
        let bf = file.to_bf16(t).unwrap();
        let got_bf: Vec<u64> = bf.iter().map(|x| u64::from(x.to_bits())).collect();
        assert_eq!(got_bf, u64s(&want["bf16_bits"]), "{tname} bf16");
    }
}

fn expected_file(exp: &Value, name: &str) -> Value {
    exp["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["file"] == name)
        .unwrap()
        .clone()
}

#[test]
fn every_fixture_matches_the_writer_read_into_memory() {
    let exp = expected();
    for f in exp["files"].as_array().unwrap() {
        let file = GgufFile::open_in_memory(fixture(f["file"].as_str().unwrap())).unwrap();
        check_file(&file, f);
    }
}

#[test]
fn every_fixture_matches_the_writer_memory_mapped() {
    let exp = expected();
    for f in exp["files"].as_array().unwrap() {
        // Contract: the fixtures are checked-in files nothing writes to while the tests run.
        let file = GgufFile::open(fixture(f["file"].as_str().unwrap())).unwrap();
        check_file(&file, f);
    }
}

#[test]
fn ggml_type_table_matches_gguf_py() {
    let exp = expected();
    let table = exp["ggml_types"].as_array().unwrap();
    assert_eq!(table.len(), GgmlType::ALL.len());
    for row in table {
        let id = row[1].as_u64().unwrap() as u32;
        let t = GgmlType::from_id(id).unwrap_or_else(|| panic!("id {id} unknown"));
        assert_eq!(t.id(), id);
        assert_eq!(t.name(), row[0].as_str().unwrap());
        assert_eq!(u64::from(t.block_size()), row[2].as_u64().unwrap(), "{t}");
        assert_eq!(u64::from(t.type_size()), row[3].as_u64().unwrap(), "{t}");
    }
    for id in [4, 5, 31, 32, 33, 36, 37, 38, 42, u32::MAX] {
        assert_eq!(GgmlType::from_id(id), None, "{id}");
    }
    for row in exp["value_types"].as_array().unwrap() {
        let t = ValueType::from_id(row[1].as_u64().unwrap() as u32).unwrap();
        assert_eq!(t.name(), row[0].as_str().unwrap());
    }
    assert_eq!(ValueType::from_id(13), None);
}

#[test]
fn v2_and_v3_fixtures_hold_the_same_content() {
    let v2 = GgufFile::open_in_memory(fixture("tiny_v2.gguf")).unwrap();
    let v3 = GgufFile::open_in_memory(fixture("tiny_v3.gguf")).unwrap();
    assert_eq!((v2.version(), v3.version()), (2, 3));
    assert_eq!(v2.metadata(), v3.metadata());
    assert_eq!(v2.tensors(), v3.tensors());
}

#[test]
fn typed_getters_accept_the_widths_gguf_py_writes() {
    let f = GgufFile::open_in_memory(fixture("tiny_v3.gguf")).unwrap();
    let exp = expected_file(&expected(), "tiny_v3.gguf");
    let meta = |k: &str| {
        exp["metadata"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["key"] == k)
            .unwrap()["value"]
            .clone()
    };
    // add_uint32 writes u32; a Python int through add_key_value writes i32: both read as u32.
    assert_eq!(
        u64::from(f.get_u32("clip.vision.image_size").unwrap()),
        meta("clip.vision.image_size").as_u64().unwrap()
    );
    assert_eq!(f.get_u32("clip.vision.block_count").unwrap(), 1);
    assert_eq!(f.get_u32("test.u8").unwrap(), 200);
    assert_eq!(f.get_i32("test.i16").unwrap(), -30000);
    assert_eq!(
        f.get_u64("test.u64").unwrap(),
        meta("test.u64").as_u64().unwrap()
    );
    assert_eq!(
        f.get_i64("test.i64").unwrap(),
        meta("test.i64").as_i64().unwrap()
    );
    assert_eq!(
        f.get_f32("test.f32").unwrap(),
        meta("test.f32").as_f64().unwrap() as f32
    );
    assert_eq!(
        f.get_f64("test.f64").unwrap(),
        meta("test.f64").as_f64().unwrap()
    );
    assert!(f.get_bool("test.bool").unwrap());
    assert_eq!(
        f.get_str("test.string").unwrap(),
        meta("test.string").as_str().unwrap()
    );
    let mean_want: Vec<f32> = exp["metadata"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["key"] == "clip.vision.image_mean")
        .unwrap()["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["value"].as_f64().unwrap() as f32)
        .collect();
    assert_eq!(
        f.get_f32_array("clip.vision.image_mean").unwrap(),
        mean_want
    );
    assert_eq!(f.get_i32_array("test.arr_i32").unwrap(), [-5, 0, 7]);
    assert_eq!(f.get_u32_array("test.arr_u8").unwrap(), [0, 1, 255]);
    assert_eq!(
        f.get_i64_array("test.arr_i64").unwrap(),
        [i64::MIN, i64::MAX]
    );
    assert_eq!(
        f.get_str_array("test.arr_str").unwrap(),
        ["a", "\u{df}\u{e7}", "longer string"]
    );
    let nested = f.get_array("test.nested").unwrap();
    assert_eq!(nested.elem_type(), ValueType::Array);
    assert_eq!(nested.len(), 2);

    // Wrong type, out of range, missing: typed errors naming the key.
    let err = f.get_u32("test.i32").unwrap_err();
    assert!(
        matches!(&err, GgufError::WrongType { key, expected: "u32", .. } if key == "test.i32"),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "metadata key \"test.i32\": expected u32, found i32 -2000000000"
    );
    assert!(matches!(
        f.get_u32("test.u64"),
        Err(GgufError::WrongType { .. })
    ));
    assert!(matches!(
        f.get_str("test.u8"),
        Err(GgufError::WrongType { .. })
    ));
    assert!(matches!(
        f.get_u32_array("test.arr_i8"),
        Err(GgufError::WrongType { .. })
    ));
    assert!(
        matches!(f.get_f32("no.such.key"), Err(GgufError::MissingKey { key }) if key == "no.such.key")
    );
    assert!(matches!(
        f.require_tensor("nope"),
        Err(GgufError::MissingTensor { .. })
    ));
}

#[test]
fn unsupported_types_are_listed_then_refused_by_name() {
    let f = GgufFile::open_in_memory(fixture("q4k_v3.gguf")).unwrap();
    let t = f.require_tensor("v.blk.0.attn_q.weight").unwrap();
    assert_eq!(t.ggml_type, GgmlType::Q4_K);
    assert_eq!(t.shape(), [2, 256]);
    let err = f.to_bf16(t).unwrap_err();
    assert_eq!(
        err.to_string(),
        "tensor v.blk.0.attn_q.weight has type Q4_K; conversion supports F32, F16, BF16, Q8_0"
    );
    // The raw bytes are still there for whoever dequantizes Q4_K.
    assert_eq!(f.tensor_bytes(t).len(), 288);
}

#[test]
fn zero_copy_views_match_conversion() {
    let f = GgufFile::open(fixture("tiny_v3.gguf")).unwrap();
    let t = f.require_tensor("v.position_embd.weight").unwrap();
    let v = f.view(t).unwrap();
    // A page-aligned map and 32-aligned offsets make the cast possible.
    assert_eq!(v.as_f32().unwrap(), f.to_f32(t).unwrap().as_slice());
    assert!(v.as_bf16().is_none());
    let b = f.require_tensor("v.blk.0.ffn_up.weight").unwrap();
    assert_eq!(
        f.view(b).unwrap().as_bf16().unwrap(),
        f.to_bf16(b).unwrap().as_slice()
    );
    let h = f.require_tensor("v.blk.0.attn_q.weight").unwrap();
    let h16 = f.view(h).unwrap().as_f16().unwrap();
    let widened: Vec<f32> = h16.iter().map(|x| x.to_f32()).collect();
    assert_eq!(widened, f.to_f32(h).unwrap());
}

#[test]
fn a_tensor_info_from_another_file_is_refused() {
    let a = GgufFile::open_in_memory(fixture("tiny_v3.gguf")).unwrap();
    let b = GgufFile::open_in_memory(fixture("q4k_v3.gguf")).unwrap();
    let foreign = b.require_tensor("v.blk.0.attn_q.bias").unwrap();
    assert!(matches!(
        a.to_f32(foreign),
        Err(GgufError::ForeignTensor { .. })
    ));
    // Same name, different info: still foreign.
    let other = b.require_tensor("v.blk.0.attn_q.weight").unwrap();
    assert!(matches!(
        a.view(other),
        Err(GgufError::ForeignTensor { .. })
    ));
}

#[test]
fn open_errors_are_typed() {
    let missing = fixture("does_not_exist.gguf");
    let err = GgufFile::open(&missing).unwrap_err();
    assert!(matches!(err, GgufError::Io { .. }));
    assert!(err.to_string().contains("does_not_exist.gguf"));

    let dir = std::env::temp_dir().join(format!("gguf-reader-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.gguf");
    let mut bytes = std::fs::read(fixture("tiny_v3.gguf")).unwrap();
    bytes[4] = 1; // version 1
    std::fs::write(&bad, &bytes).unwrap();
    let empty = dir.join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    let mapped = GgufFile::open(&bad).unwrap_err();
    let read = GgufFile::open_in_memory(&bad).unwrap_err();
    let empty_err = GgufFile::open(&empty).unwrap_err();
    std::fs::remove_dir_all(&dir).unwrap();
    for err in [mapped, read] {
        assert!(
            matches!(err, GgufError::UnsupportedVersion { version: 1 }),
            "{err}"
        );
    }
    assert!(
        matches!(empty_err, GgufError::Truncated { .. }),
        "{empty_err}"
    );
}
