//! Shared helpers: the fixture repositories, a tiny safetensors rewriter, oracle tensors.
#![allow(dead_code)]

use serde_json::{Map, Value};
use st_reader::Checkpoint;
use std::path::PathBuf;
#[allow(unused_imports)] // not every test file measures rows
pub use tower_core::rel_l2;

/// `fixtures/` at the workspace root.
pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

/// One tensor of a safetensors file: name, dtype spelling, shape, raw bytes.
#[derive(Clone, Debug)]
pub struct Entry {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

/// Every tensor of a safetensors file, in header order.
pub fn read_entries(path: &std::path::Path) -> Vec<Entry> {
    let b = std::fs::read(path).expect("read safetensors");
    let n = u64::from_le_bytes(b[..8].try_into().expect("8 bytes")) as usize;
    let header: Map<String, Value> = serde_json::from_slice(&b[8..8 + n]).expect("header JSON");
    let data = &b[8 + n..];
    header
        .into_iter()
        .filter(|(k, _)| k != "__metadata__")
        .map(|(name, v)| {
            let off = v["data_offsets"].as_array().expect("offsets");
            let (a, z) = (
                off[0].as_u64().unwrap() as usize,
                off[1].as_u64().unwrap() as usize,
            );
            Entry {
                name,
                dtype: v["dtype"].as_str().expect("dtype").to_string(),
                shape: v["shape"]
                    .as_array()
                    .expect("shape")
                    .iter()
                    .map(|d| d.as_u64().unwrap() as usize)
                    .collect(),
                bytes: data[a..z].to_vec(),
            }
        })
        .collect()
}

/// Serialises entries as one safetensors file (header padded to 8 bytes).
pub fn write_entries(entries: &[Entry]) -> Vec<u8> {
    let mut header = Map::new();
    let mut data = Vec::new();
    for e in entries {
        let start = data.len();
        data.extend_from_slice(&e.bytes);
        header.insert(
            e.name.clone(),
            serde_json::json!({"dtype": e.dtype, "shape": e.shape, "data_offsets": [start, data.len()]}),
        );
    }
    let mut h = serde_json::to_vec(&Value::Object(header)).expect("header");
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(&data);
    out
}

/// The mini repository `fixtures/models/<variant>`: its tensors and its config.json.
pub fn repo(variant: &str) -> (Vec<Entry>, Value) {
    let dir = fixtures().join("models").join(variant);
    let entries = read_entries(&dir.join("model.safetensors"));
    let config = serde_json::from_slice(&std::fs::read(dir.join("config.json")).expect("config"))
        .expect("config JSON");
    (entries, config)
}

/// The repository's tensors after `edit`, as an in-memory checkpoint.
pub fn edited(variant: &str, edit: impl FnOnce(&mut Vec<Entry>)) -> (Checkpoint, Value) {
    let (mut entries, config) = repo(variant);
    edit(&mut entries);
    let ck = Checkpoint::from_bytes(write_entries(&entries)).expect("rewritten checkpoint parses");
    (ck, config)
}

/// An oracle tensor of `fixtures/outputs/<variant>/<case>.safetensors` as f64, with its shape.
pub fn oracle(variant: &str, case: &str, name: &str) -> (Vec<usize>, Vec<f64>) {
    let path = fixtures()
        .join("outputs")
        .join(variant)
        .join(format!("{case}.safetensors"));
    let e = read_entries(&path)
        .into_iter()
        .find(|e| e.name == name)
        .unwrap_or_else(|| panic!("{name} in {}", path.display()));
    let data = match e.dtype.as_str() {
        "F64" => e
            .bytes
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        "F32" => e
            .bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect(),
        "I64" => e
            .bytes
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect(),
        other => panic!("dtype {other}"),
    };
    (e.shape, data)
}
