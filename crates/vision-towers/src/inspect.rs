//! `vtower inspect`: one JSON object describing a weight file.

use crate::{detect_family, Family, WeightFile};
use gguf_reader::MetaValue;
use serde_json::{json, Map, Value};

/// Arrays longer than this are summarised as `{"type":…,"len":…}` in `inspect` output.
pub const INSPECT_MAX_ARRAY: usize = 64;

/// The `vtower inspect` object: format, detected family, tensors (name, dtype in the file's own
/// spelling, shape outermost-first) and metadata.
pub fn inspect_json(file: &WeightFile) -> Value {
    let family = detect_family(file).map(Family::name);
    let (tensors, metadata) = match file {
        WeightFile::Gguf(g) => {
            let tensors = g
                .tensors()
                .iter()
                .map(|t| json!({"name": t.name, "dtype": t.ggml_type.name(), "shape": t.shape()}))
                .collect::<Vec<_>>();
            let mut meta = Map::new();
            for (key, value) in g.metadata() {
                meta.insert(key.clone(), gguf_value(value));
            }
            (tensors, Value::Object(meta))
        }
        WeightFile::SafeTensors(st) => {
            let tensors = st
                .tensors()
                .map(|t| json!({"name": t.name, "dtype": t.dtype.as_str(), "shape": t.shape}))
                .collect::<Vec<_>>();
            let mut meta = Map::new();
            let st_meta = st.metadata();
            if !st_meta.is_empty() {
                meta.insert("__metadata__".into(), json!(st_meta));
            }
            if let Some(config) = st.config() {
                meta.insert("config.json".into(), config.clone());
            }
            (tensors, Value::Object(meta))
        }
    };
    json!({
        "format": file.format(),
        "family": family,
        "tensors": tensors,
        "metadata": metadata,
    })
}

/// A GGUF metadata value as JSON; long arrays are summarised by element type and length.
fn gguf_value(value: &MetaValue) -> Value {
    match value {
        MetaValue::U8(v) => json!(v),
        MetaValue::I8(v) => json!(v),
        MetaValue::U16(v) => json!(v),
        MetaValue::I16(v) => json!(v),
        MetaValue::U32(v) => json!(v),
        MetaValue::I32(v) => json!(v),
        MetaValue::U64(v) => json!(v),
        MetaValue::I64(v) => json!(v),
        MetaValue::F32(v) => json!(v),
        MetaValue::F64(v) => json!(v),
        MetaValue::Bool(v) => json!(v),
        MetaValue::String(v) => json!(v),
        MetaValue::Array(arr) => {
            if arr.len() > INSPECT_MAX_ARRAY {
                json!({"type": arr.element_type_name(), "len": arr.len()})
            } else {
                Value::Array(arr.iter().map(gguf_value).collect())
            }
        }
    }
}
