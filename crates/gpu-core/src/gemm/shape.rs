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
