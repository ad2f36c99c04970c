//! Tensor infos, typed views of tensor bytes, and conversion to f32 and bf16.

use half::{bf16, f16, slice::HalfFloatSliceExt};

use crate::{GgmlType, GgufError};

/// One tensor's entry in the file's tensor-info table, validated against the file.
///
/// Built only by the parser: the dimensions' product, the byte size, the alignment of the offset
/// and the bounds of the bytes have all been checked.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TensorInfo {
    /// The tensor's name, e.g. `v.blk.0.attn_q.weight`.
    pub name: String,
    /// Its element type.
    pub ggml_type: GgmlType,
    /// Dimensions in ggml order: innermost (contiguous) first; 1 to 4 of them.
    pub ne: Vec<u64>,
    /// Offset of its bytes from the start of the data section.
    pub offset: u64,
    /// Size of its bytes.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Dimensions outermost first (numpy / PyTorch order): `ne` reversed.
    pub fn shape(&self) -> Vec<u64> {
        self.ne.iter().rev().copied().collect()
    }

    /// Number of elements (the product of `ne`; checked not to overflow when parsed).
    pub fn n_elements(&self) -> u64 {
        self.ne.iter().product()
    }
}

/// A tensor's info together with its bytes in the file.
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    info: &'a TensorInfo,
    bytes: &'a [u8],
}

impl<'a> TensorView<'a> {
    /// Pairs an info with its bytes; `bytes.len()` must equal `info.n_bytes`.
    pub(crate) fn new(info: &'a TensorInfo, bytes: &'a [u8]) -> Self {
        TensorView { info, bytes }
    }

    /// The tensor's info.
    pub fn info(&self) -> &'a TensorInfo {
        self.info
    }

    /// The tensor's raw bytes as stored (little-endian, ggml block layout).
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The F32 data without copying; `None` for other types or bytes not 4-aligned in memory.
    pub fn as_f32(&self) -> Option<&'a [f32]> {
        self.cast(GgmlType::F32)
    }

    /// The F16 data without copying; `None` for other types or bytes not 2-aligned in memory.
    pub fn as_f16(&self) -> Option<&'a [f16]> {
        self.cast(GgmlType::F16)
    }

    /// The BF16 data without copying; `None` for other types or bytes not 2-aligned in memory.
    pub fn as_bf16(&self) -> Option<&'a [bf16]> {
        self.cast(GgmlType::BF16)
    }

    /// The bytes must be exactly the tensor's (always so for views the file hands out).
    fn check_len(&self) -> Result<(), GgufError> {
        if u64::try_from(self.bytes.len()).ok() == Some(self.info.n_bytes) {
            Ok(())
        } else {
            Err(GgufError::ForeignTensor {
                tensor: self.info.name.clone(),
            })
        }
    }

    fn cast<T: bytemuck::Pod>(&self, ty: GgmlType) -> Option<&'a [T]> {
        // GGUF stores little-endian values; a plain cast is only right on a little-endian host.
        if cfg!(target_endian = "little") && self.info.ggml_type == ty {
            bytemuck::try_cast_slice(self.bytes).ok()
        } else {
            None
        }
    }

    /// The values as f32 (Q8_0 dequantized as ggml does: `scale * q`).
    pub fn to_f32(&self) -> Result<Vec<f32>, GgufError> {
        self.check_len()?;
        if let Some(halves) = self.as_f16() {
            // half's slice conversion uses F16C when the CPU has it (runtime detection).
            let mut out = vec![0f32; halves.len()];
            halves.convert_to_f32_slice(&mut out);
            return Ok(out);
        }
        convert(self.info, self.bytes, |x| x, bf16::to_f32, f16::to_f32)
    }

    /// The values as bf16, rounded to nearest-even from f32 like gguf-py's `quants.BF16`.
    pub fn to_bf16(&self) -> Result<Vec<bf16>, GgufError> {
        self.check_len()?;
        if let Some(halves) = self.as_f16() {
            // Widen through a small f32 buffer to use half's F16C path, as `to_f32` does.
            let mut out = Vec::with_capacity(halves.len());
            let mut buf = [0f32; 1024];
            for chunk in halves.chunks(buf.len()) {
                let wide = &mut buf[..chunk.len()];
                chunk.convert_to_f32_slice(wide);
                out.extend(wide.iter().map(|&x| bf16::from_f32(x)));
            }
            return Ok(out);
        }
        convert(
            self.info,
            self.bytes,
            bf16::from_f32,
            |x| x,
            |h| bf16::from_f32(h.to_f32()),
        )
    }
}

/// Bytes per Q8_0 block: an f16 scale then 32 i8 (ggml `block_q8_0`).
const Q8_0_BLOCK_BYTES: usize = 34;

/// Decodes `bytes` of `info`'s type into `T`: `from_f32` for F32 and Q8_0 products, `from_bf16`
/// and `from_f16` for the 16-bit types. `bytes` is the tensor's, length already checked.
fn convert<T>(
    info: &TensorInfo,
    bytes: &[u8],
    from_f32: impl Fn(f32) -> T,
    from_bf16: impl Fn(bf16) -> T,
    from_f16: impl Fn(f16) -> T,
) -> Result<Vec<T>, GgufError> {
    Ok(match info.ggml_type {
        GgmlType::F32 => {
            let (words, _) = bytes.as_chunks::<4>();
            words
                .iter()
                .map(|&w| from_f32(f32::from_le_bytes(w)))
                .collect()
        }
        GgmlType::F16 => {
            let (halves, _) = bytes.as_chunks::<2>();
            halves
                .iter()
                .map(|&h| from_f16(f16::from_le_bytes(h)))
                .collect()
        }
        GgmlType::BF16 => {
            let (halves, _) = bytes.as_chunks::<2>();
            halves
                .iter()
                .map(|&h| from_bf16(bf16::from_le_bytes(h)))
                .collect()
        }
        GgmlType::Q8_0 => {
            let (blocks, _) = bytes.as_chunks::<Q8_0_BLOCK_BYTES>();
            let mut out = Vec::with_capacity(blocks.len() * 32);
            for block in blocks {
                let [s0, s1, quants @ ..] = block;
                let d = f16::from_le_bytes([*s0, *s1]).to_f32();
                out.extend(
                    quants
                        .iter()
                        .map(|&q| from_f32(d * f32::from(i8::from_le_bytes([q])))),
                );
            }
            out
        }
        other => {
            return Err(GgufError::UnsupportedConversion {
                tensor: info.name.clone(),
                ggml_type: other,
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(ty: GgmlType, ne: Vec<u64>, n_bytes: u64) -> TensorInfo {
        TensorInfo {
            name: "t".into(),
            ggml_type: ty,
            ne,
            offset: 0,
            n_bytes,
        }
    }

    #[test]
    fn shape_reverses_ne() {
        let t = info(GgmlType::F32, vec![3, 2, 5], 120);
        assert_eq!(t.shape(), vec![5, 2, 3]);
        assert_eq!(t.n_elements(), 30);
    }

    #[test]
    fn unsupported_type_is_refused_by_name() {
        let t = TensorInfo {
            name: "v.blk.0.attn_q.weight".into(),
            ..info(GgmlType::Q4_K, vec![256], 144)
        };
        let err = TensorView::new(&t, &[0; 144]).to_f32().unwrap_err();
        assert!(matches!(
            err,
            GgufError::UnsupportedConversion {
                ggml_type: GgmlType::Q4_K,
                ..
            }
        ));
        assert_eq!(
            err.to_string(),
            "tensor v.blk.0.attn_q.weight has type Q4_K; conversion supports F32, F16, BF16, Q8_0"
        );
    }

    #[test]
    fn f16_converts_the_same_aligned_or_not() {
        // IEEE binary16: 1.0, -2.0, 65504 (max), 2^-24 (smallest subnormal), -0.0.
        let bits: [u16; 5] = [0x3c00, 0xc000, 0x7bff, 0x0001, 0x8000];
        let want = [1.0f32, -2.0, 65504.0, 2f32.powi(-24), -0.0];
        let t = info(GgmlType::F16, vec![5], 10);
        // A u16 buffer is 2-aligned: start 0 takes the F16C slice path, start 1 the scalar one.
        let mut storage = [0u16; 6];
        let buf: &mut [u8] = bytemuck::cast_slice_mut(&mut storage);
        for start in [0, 1] {
            for (i, b) in bits.iter().enumerate() {
                buf[start + 2 * i..start + 2 * i + 2].copy_from_slice(&b.to_le_bytes());
            }
            let v = TensorView::new(&t, &buf[start..start + 10]);
            assert_eq!(v.as_f16().is_some(), start == 0);
            let got: Vec<u32> = v.to_f32().unwrap().iter().map(|x| x.to_bits()).collect();
            assert_eq!(got, want.map(f32::to_bits), "start {start}");
            let bf: Vec<f32> = v.to_bf16().unwrap().iter().map(|x| x.to_f32()).collect();
            // All five are exact in bf16 (8 exponent bits, 7 mantissa bits) except 65504,
            // which rounds to nearest-even: 65536.
            assert_eq!(
                bf,
                [1.0, -2.0, 65536.0, 2f32.powi(-24), -0.0],
                "start {start}"
            );
        }
    }

    #[test]
    fn wrong_byte_count_is_an_error_not_a_panic() {
        let t = info(GgmlType::F32, vec![4], 16);
        let err = TensorView::new(&t, &[0; 12]).to_bf16().unwrap_err();
        assert!(matches!(err, GgufError::ForeignTensor { .. }));
    }
}
