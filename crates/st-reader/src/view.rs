//! Tensor descriptions, borrowed views and dtype conversion.

use std::ops::Range;

use half::{bf16, f16};

use crate::{Dtype, StError};

/// Where one tensor lives in a checkpoint, as its header declares it (already validated).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TensorInfo {
    /// The tensor's name as spelled in the file.
    pub name: String,
    /// Its element type.
    pub dtype: Dtype,
    /// Its shape, outermost dimension first (row-major, little-endian data).
    pub shape: Vec<usize>,
    /// Index into [`crate::Checkpoint::shard_paths`] of the file holding it.
    pub shard: usize,
    /// `data_offsets` from the header: the byte range relative to the shard's data buffer.
    pub data_offsets: (usize, usize),
    /// The same bytes as an absolute byte range in the shard file.
    pub file_range: Range<usize>,
}

impl TensorInfo {
    /// Number of elements (the product of `shape`; 1 for a scalar). Validated at open not to
    /// overflow; saturates at `usize::MAX` for a hand-edited shape.
    pub fn numel(&self) -> usize {
        self.shape.iter().fold(1usize, |n, &d| n.saturating_mul(d))
    }

    /// Length of the tensor's data in bytes.
    pub fn byte_len(&self) -> usize {
        self.file_range.len()
    }
}

/// A tensor borrowed from an open [`crate::Checkpoint`]: its description and its raw bytes.
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    info: &'a TensorInfo,
    data: &'a [u8],
}

impl<'a> TensorView<'a> {
    pub(crate) fn new(info: &'a TensorInfo, data: &'a [u8]) -> Self {
        Self { info, data }
    }

    /// The tensor's description.
    pub fn info(&self) -> &'a TensorInfo {
        self.info
    }

    /// The tensor's name as spelled in the file.
    pub fn name(&self) -> &'a str {
        &self.info.name
    }

    /// The tensor's element type.
    pub fn dtype(&self) -> &'a Dtype {
        &self.info.dtype
    }

    /// The tensor's shape.
    pub fn shape(&self) -> &'a [usize] {
        &self.info.shape
    }

    /// The raw little-endian bytes (no alignment guarantee).
    pub fn bytes(&self) -> &'a [u8] {
        self.data
    }

    /// Converts a BF16, F16 or F32 tensor to `f32` values (exact for all three).
    pub fn to_f32(&self) -> Result<Vec<f32>, StError> {
        Ok(match self.info.dtype {
            Dtype::F32 => self
                .data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Dtype::F16 => self
                .data
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Dtype::BF16 => self
                .data
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            _ => return Err(self.unsupported("f32")),
        })
    }

    /// Converts a BF16, F16 or F32 tensor to `bf16`, rounding to nearest-even where needed.
    pub fn to_bf16(&self) -> Result<Vec<bf16>, StError> {
        Ok(match self.info.dtype {
            Dtype::BF16 => self
                .data
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]))
                .collect(),
            Dtype::F16 => self
                .data
                .chunks_exact(2)
                .map(|c| bf16::from_f32(f16::from_le_bytes([c[0], c[1]]).to_f32()))
                .collect(),
            Dtype::F32 => self
                .data
                .chunks_exact(4)
                .map(|c| bf16::from_f32(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .collect(),
            _ => return Err(self.unsupported("bf16")),
        })
    }

    fn unsupported(&self, target: &'static str) -> StError {
        StError::UnsupportedConversion {
            tensor: self.info.name.clone(),
            dtype: self.info.dtype.as_str().to_owned(),
            target,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::test_util::{expected_file, fixtures, unhex};
    use crate::{Checkpoint, StError};
    use serde_json::Value;

    fn f32s(v: &Value) -> Vec<f32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| match x {
                Value::String(s) if s == "inf" => f32::INFINITY,
                Value::String(s) if s == "-inf" => f32::NEG_INFINITY,
                x => x.as_f64().unwrap() as f32,
            })
            .collect()
    }

    #[test]
    fn conversions_match_writer_values() {
        let ckpt = Checkpoint::open(fixtures().join("single.safetensors")).unwrap();
        let exp = expected_file("single.safetensors");
        for name in ["f32", "f16", "bf16"] {
            let view = ckpt.tensor(name).unwrap();
            let e = &exp["tensors"][name];
            let got = view.to_f32().unwrap();
            let want = f32s(&e["f32"]);
            // Bitwise, so -0.0 and subnormals count.
            assert_eq!(
                got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "{name} f32"
            );
            // ml_dtypes' round-to-nearest-even bf16 bits.
            let bits: Vec<u16> = view
                .to_bf16()
                .unwrap()
                .iter()
                .map(|b| b.to_bits())
                .collect();
            let want_bits: Vec<u16> = e["bf16_bits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b.as_u64().unwrap() as u16)
                .collect();
            assert_eq!(bits, want_bits, "{name} bf16");
            assert_eq!(ckpt.to_f32(&view).unwrap(), got);
        }
    }

    #[test]
    fn integer_tensors_are_refused_by_name() {
        let ckpt = Checkpoint::open(fixtures().join("single.safetensors")).unwrap();
        let exp = expected_file("single.safetensors");
        for (name, dtype) in [("i64", "I64"), ("u8", "U8")] {
            let view = ckpt.tensor(name).unwrap();
            assert_eq!(
                view.bytes(),
                unhex(exp["tensors"][name]["raw_hex"].as_str().unwrap())
            );
            for (res, target) in [(view.to_f32().err(), "f32"), (view.to_bf16().err(), "bf16")] {
                match res {
                    Some(StError::UnsupportedConversion {
                        tensor,
                        dtype: d,
                        target: t,
                    }) => {
                        assert_eq!((tensor.as_str(), d.as_str(), t), (name, dtype, target));
                    }
                    other => panic!("{other:?}"),
                }
            }
        }
        let i64s: Vec<i64> = ckpt
            .tensor("i64")
            .unwrap()
            .bytes()
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let want: Vec<i64> = exp["tensors"]["i64"]["ints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap())
            .collect();
        assert_eq!(i64s, want);
    }

    #[test]
    fn f8_is_listed_and_refused_for_conversion() {
        let ckpt = Checkpoint::open(fixtures().join("f8.safetensors")).unwrap();
        let exp = expected_file("f8.safetensors");
        let view = ckpt.tensor("w_f8").unwrap();
        assert_eq!(view.dtype(), &crate::Dtype::F8_E4M3);
        assert_eq!(view.dtype().as_str(), exp["tensors"]["w_f8"]["dtype"]);
        assert_eq!(
            view.bytes(),
            unhex(exp["tensors"]["w_f8"]["raw_hex"].as_str().unwrap())
        );
        assert!(
            matches!(view.to_f32(), Err(StError::UnsupportedConversion { tensor, dtype, .. }) if tensor == "w_f8" && dtype == "F8_E4M3")
        );
        assert_eq!(
            ckpt.tensor("scale").unwrap().to_f32().unwrap(),
            f32s(&exp["tensors"]["scale"]["f32"])
        );
        assert_eq!(
            ckpt.metadata().get("quant").map(String::as_str),
            Some("fp8")
        );
    }
}
