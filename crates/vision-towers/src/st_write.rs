//! Writing `.safetensors` files (the outputs of `vtower prep` and `vtower encode`).

use serde_json::{json, Map, Value};
use std::io::Write;
use std::path::Path;

/// The element types `vtower` writes, spelled as safetensors spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutDtype {
    /// 32-bit float.
    F32,
    /// 64-bit signed integer.
    I64,
    /// 8-bit unsigned integer.
    U8,
}

impl OutDtype {
    fn name(self) -> &'static str {
        match self {
            OutDtype::F32 => "F32",
            OutDtype::I64 => "I64",
            OutDtype::U8 => "U8",
        }
    }

    fn size(self) -> usize {
        match self {
            OutDtype::F32 => 4,
            OutDtype::I64 => 8,
            OutDtype::U8 => 1,
        }
    }
}

/// One named tensor to write: its dtype, shape (outermost first) and little-endian bytes.
#[derive(Debug, Clone)]
pub struct OutTensor {
    /// The tensor's name in the file.
    pub name: String,
    /// Its element type.
    pub dtype: OutDtype,
    /// Its shape, outermost first.
    pub shape: Vec<usize>,
    /// Its data, little-endian, row-major.
    pub data: Vec<u8>,
}

impl OutTensor {
    /// An F32 tensor from values.
    pub fn f32(name: &str, shape: Vec<usize>, values: &[f32]) -> OutTensor {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        OutTensor {
            name: name.to_string(),
            dtype: OutDtype::F32,
            shape,
            data,
        }
    }

    /// An I64 tensor from values.
    pub fn i64(name: &str, shape: Vec<usize>, values: &[i64]) -> OutTensor {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        OutTensor {
            name: name.to_string(),
            dtype: OutDtype::I64,
            shape,
            data,
        }
    }

    /// A U8 tensor from values.
    pub fn u8(name: &str, shape: Vec<usize>, values: Vec<u8>) -> OutTensor {
        OutTensor {
            name: name.to_string(),
            dtype: OutDtype::U8,
            shape,
            data: values,
        }
    }
}

/// Why a safetensors file could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// A tensor's byte length does not match its shape and dtype.
    #[error("tensor {name}: {got} bytes for shape {shape:?} of {dtype} (expected {expected})")]
    Size {
        /// The tensor.
        name: String,
        /// Its dtype.
        dtype: &'static str,
        /// Its shape.
        shape: Vec<usize>,
        /// Bytes given.
        got: usize,
        /// Bytes its shape needs.
        expected: usize,
    },
    /// Two tensors share a name.
    #[error("tensor name {0} appears twice")]
    Duplicate(String),
    /// The file could not be written.
    #[error("{path}: {source}")]
    Io {
        /// The output path.
        path: std::path::PathBuf,
        /// The operating system's answer.
        #[source]
        source: std::io::Error,
    },
}

/// safetensors pads its JSON header with spaces to a multiple of 8 bytes (safetensors
/// `serialize`: `N` aligned so the data buffer starts 8-byte aligned).
const HEADER_ALIGN: usize = 8;

/// The bytes of a safetensors file holding `tensors` in the given order and `metadata` as
/// `__metadata__`.
pub fn safetensors_bytes(
    tensors: &[OutTensor],
    metadata: &[(String, String)],
) -> Result<Vec<u8>, WriteError> {
    let mut header = Map::new();
    if !metadata.is_empty() {
        let meta: Map<String, Value> = metadata
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        header.insert("__metadata__".into(), Value::Object(meta));
    }
    let mut offset = 0usize;
    for t in tensors {
        let expected = t.shape.iter().product::<usize>() * t.dtype.size();
        if t.data.len() != expected {
            return Err(WriteError::Size {
                name: t.name.clone(),
                dtype: t.dtype.name(),
                shape: t.shape.clone(),
                got: t.data.len(),
                expected,
            });
        }
        if header.contains_key(&t.name) {
            return Err(WriteError::Duplicate(t.name.clone()));
        }
        header.insert(
            t.name.clone(),
            json!({"dtype": t.dtype.name(), "shape": t.shape, "data_offsets": [offset, offset + expected]}),
        );
        offset += expected;
    }
    let mut json = Value::Object(header).to_string().into_bytes();
    while !json.len().is_multiple_of(HEADER_ALIGN) {
        json.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + json.len() + offset);
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    for t in tensors {
        out.extend_from_slice(&t.data);
    }
    Ok(out)
}

/// Writes `tensors` to `path` as a safetensors file.
pub fn write_safetensors(
    path: &Path,
    tensors: &[OutTensor],
    metadata: &[(String, String)],
) -> Result<(), WriteError> {
    let bytes = safetensors_bytes(tensors, metadata)?;
    let io = |source| WriteError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::File::create(path).map_err(io)?;
    file.write_all(&bytes).map_err(io)?;
    file.sync_all().map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_file_reads_back_through_st_reader() {
        let tensors = vec![
            OutTensor::f32(
                "pixel_values",
                vec![1, 2, 3],
                &[0.5, -1.0, 2.0, 3.25, 0.0, 1e-3],
            ),
            OutTensor::i64("image_grid_thw", vec![1, 3], &[1, 4, 6]),
            OutTensor::u8("patch_newline_masks", vec![2], vec![1, 0]),
        ];
        let bytes = safetensors_bytes(&tensors, &[("format".into(), "pt".into())]).unwrap();
        let ckpt = st_reader::Checkpoint::from_bytes(bytes).unwrap();
        let pv = ckpt.tensor("pixel_values").unwrap();
        assert_eq!(pv.shape(), &[1, 2, 3]);
        assert_eq!(
            ckpt.to_f32(&pv).unwrap(),
            vec![0.5, -1.0, 2.0, 3.25, 0.0, 1e-3]
        );
        assert_eq!(
            ckpt.metadata().get("format").map(String::as_str),
            Some("pt")
        );
    }

    #[test]
    fn size_mismatch_is_refused() {
        let bad = OutTensor {
            name: "x".into(),
            dtype: OutDtype::F32,
            shape: vec![3],
            data: vec![0; 8],
        };
        assert!(matches!(
            safetensors_bytes(&[bad], &[]),
            Err(WriteError::Size { expected: 12, .. })
        ));
    }
}
