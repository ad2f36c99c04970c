//! The arithmetic a tower runs in.

use std::fmt;
use std::str::FromStr;

/// The arithmetic of a tower: its weights, the inputs of its GEMMs and the buffers that feed
/// them. The residual stream, norms and accumulations are f32 in every precision.
///
/// This is the one precision type of the workspace (the host towers, gpu-core's CUDA path, the
/// facade, the C ABI and Python, xtask). A new precision (the f16 of the GPU tiers) is added here
/// as a variant, and every `match` on it is then a compile error until it says what that
/// precision does: there is deliberately no catch-all arm anywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Precision {
    /// f32 values: the host reference, or the CUDA path's exactness mode (f32 GEMMs, no TF32).
    F32,
    /// bf16 weights and GEMM inputs on the tensor cores, f32 accumulation (CUDA only, compute
    /// capability 8.0 or newer).
    Bf16,
    /// f16 (IEEE half) weights and GEMM inputs on the tensor cores, f32 accumulation (CUDA only,
    /// every tier from compute capability 7.5: Turing's precision, where bf16 is refused). f16
    /// holds magnitudes up to 65504 only: a tower whose GEMM inputs leave that range gives
    /// non-finite rows, which the towers refuse as an error, never as rows.
    F16,
}

impl Precision {
    /// Every precision, in the order tables list them.
    pub const ALL: [Precision; 3] = [Precision::F32, Precision::Bf16, Precision::F16];

    /// The short name (`f32`, `bf16`, `f16`), as [`FromStr`] reads it back.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
            Precision::F16 => "f16",
        }
    }

    /// Bytes of one GEMM input element in this precision.
    pub fn gemm_input_bytes(self) -> usize {
        match self {
            Precision::F32 => 4,
            Precision::Bf16 | Precision::F16 => 2,
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A precision name that is not one of [`Precision`]'s spellings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown precision {0:?}: expected f32 (float32), bf16 (bfloat16) or f16 (float16, half)")]
pub struct ParsePrecisionError(pub String);

impl FromStr for Precision {
    type Err = ParsePrecisionError;

    /// Reads `f32` / `float32` / `fp32`, `bf16` / `bfloat16` and `f16` / `float16` / `fp16` /
    /// `half` (PyTorch's and NumPy's spellings), lower case.
    fn from_str(s: &str) -> Result<Precision, ParsePrecisionError> {
        match s {
            "f32" | "float32" | "fp32" => Ok(Precision::F32),
            "bf16" | "bfloat16" => Ok(Precision::Bf16),
            "f16" | "float16" | "fp16" | "half" => Ok(Precision::F16),
            other => Err(ParsePrecisionError(other.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_read_back_and_strangers_are_refused() {
        for p in Precision::ALL {
            assert_eq!(p.to_string().parse::<Precision>(), Ok(p));
        }
        assert_eq!("bfloat16".parse::<Precision>(), Ok(Precision::Bf16));
        assert_eq!("float32".parse::<Precision>(), Ok(Precision::F32));
        for s in ["f16", "float16", "fp16", "half"] {
            assert_eq!(s.parse::<Precision>(), Ok(Precision::F16), "{s}");
        }
        for bad in ["", "F32", "bf-16", "f16x", "int8", "F16", "half16"] {
            let e = bad.parse::<Precision>().expect_err(bad);
            assert!(e.to_string().contains("bf16"), "{e}");
            assert!(e.to_string().contains("f16 (float16"), "{e}");
        }
        assert_eq!(Precision::F16.gemm_input_bytes(), 2);
        assert_eq!(Precision::Bf16.gemm_input_bytes(), 2);
        assert_eq!(Precision::F32.gemm_input_bytes(), 4);
    }
}
