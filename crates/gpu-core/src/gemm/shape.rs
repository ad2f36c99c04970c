//! The GEMM's parameters that the cuBLASLt plan cache keys on and reports: shape, epilogue,
//! tuning mode and what tuning measured (no buffers, no device).

/// Fused epilogue after the bias.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Epilogue {
    /// Nothing.
    #[default]
    None,
    /// GELU, tanh approximation (`gelu_pytorch_tanh`), as cuBLASLt implements it.
    GeluTanh,
}

/// Shape and strides of one GEMM. Strides and offsets are in elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GemmShape {
    /// Rows of x and y (tokens).
    pub m: usize,
    /// Output features (rows of W).
    pub n: usize,
    /// Input features.
    pub k: usize,
    /// Row stride of x (≥ k).
    pub ldx: usize,
    /// Row stride of y (≥ n).
    pub ldy: usize,
    /// Element offset of x's first row in its buffer.
    pub x_offset: usize,
    /// Element offset of y's first row in its buffer (e.g. writing into a column block of a wider buffer).
    pub y_offset: usize,
    /// `y += x·Wᵀ (+bias)` instead of `y =` (beta = 1; y is read first).
    pub accumulate: bool,
}

impl GemmShape {
    /// Dense `x [m, k]`, `y [m, n]`, overwrite.
    pub fn dense(m: usize, n: usize, k: usize) -> Self {
        GemmShape {
            m,
            n,
            k,
            ldx: k,
            ldy: n,
            x_offset: 0,
            y_offset: 0,
            accumulate: false,
        }
    }
}

/// How a GEMM shape's cuBLASLt algorithm is chosen, once per shape per [`Device`](crate::Device).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GemmTuning {
    /// cuBLASLt's first heuristic answer, untimed (the same choice every run).
    Heuristic,
    /// The fastest of up to [`GEMM_CANDIDATES`] heuristic answers, timed on the call's own buffers
    /// the first time a shape runs outside a graph capture (rows are reproducible within a process).
    #[default]
    Measured,
}

/// The environment variable that sets [`GemmTuning`] when a [`Device`](crate::Device) opens, read
/// once there: `heuristic` ([`GemmTuning::Heuristic`]: cuBLASLt's first answer for every shape, so
/// every process runs the same algorithms and its device rows repeat bitwise from run to run, and
/// each shape runs one GEMM kernel, not up to [`GEMM_CANDIDATES`]: what compute-sanitizer has to
/// instrument, `kernels/sanitize_device.sh`) or `measured` ([`GemmTuning::Measured`], the default).
/// Unset or empty: the default. Any other value fails the device's opening, never ignored.
pub const GEMM_TUNING_ENV: &str = "GPU_CORE_GEMM_TUNING";

/// The tuning [`GEMM_TUNING_ENV`]'s value names (unset or empty: the default), or the value, as
/// text, when it names none.
pub(crate) fn gemm_tuning_from(value: Option<&std::ffi::OsStr>) -> Result<GemmTuning, String> {
    let Some(value) = value else {
        return Ok(GemmTuning::default());
    };
    match value.to_str().map(str::trim) {
        Some("") => Ok(GemmTuning::default()),
        Some("heuristic") => Ok(GemmTuning::Heuristic),
        Some("measured") => Ok(GemmTuning::Measured),
        _ => Err(value.to_string_lossy().into_owned()),
    }
}

/// How many algorithms cuBLASLt's heuristic is asked for when a shape is tuned.
pub const GEMM_CANDIDATES: usize = 16;

/// What tuning one GEMM shape measured (see [`Device::gemm_tuned`](crate::Device::gemm_tuned)).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GemmTuned {
    /// The shape (offsets zeroed).
    pub shape: GemmShape,
    /// bf16 operands (else f16 or f32).
    pub bf16: bool,
    /// f16 operands (else bf16 or f32).
    pub f16: bool,
    /// Candidates cuBLASLt offered and that ran.
    pub candidates: usize,
    /// Median ms of the heuristic's first answer.
    pub heuristic_ms: f32,
    /// Median ms of the fastest candidate.
    pub best_ms: f32,
    /// Median ms of the candidate kept (the heuristic's unless another beat it by 2 %).
    pub chosen_ms: f32,
    /// Index of the kept candidate in the heuristic's order (0 = its first answer).
    pub chosen: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn the_tuning_variable_names_the_two_modes_and_refuses_anything_else() {
        for (value, want) in [
            (None, GemmTuning::Measured),
            (Some(""), GemmTuning::Measured),
            (Some(" "), GemmTuning::Measured),
            (Some("heuristic"), GemmTuning::Heuristic),
            (Some("measured"), GemmTuning::Measured),
        ] {
            assert_eq!(
                gemm_tuning_from(value.map(OsStr::new)),
                Ok(want),
                "{value:?}"
            );
        }
        for bad in ["Heuristic", "1", "fast", "heuristic,measured"] {
            assert_eq!(
                gemm_tuning_from(Some(OsStr::new(bad))),
                Err(bad.to_string())
            );
        }
    }
}
