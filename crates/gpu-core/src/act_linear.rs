//! [`ActLinear`]: a linear layer and the activation that follows it (an MLP's fc1, or its gate|up
//! projection with the gate), uploaded in the layout of the fastest path the device has and run as
//! one fused kernel ([`Device::gemm_act`]) or as the GEMM and a separate activation pass.
//!
//! **Architecture Invariant:** the choice is made once, at upload, from the precision, the kind of
//! layer ([`fuses`]), the device and the shape ([`Device::fused_gemm_supports`]); a fused gated weight
//! is stored interleaved ([`crate::interleave_gate_up`]) and is never read by the two-step path, nor a
//! stacked one by the kernel.

use crate::upload::{HostSource, Stager};
use crate::{
    Device, Epilogue, FusedAct, GemmBuffer, GemmShape, GpuError, InterleavedGateUp, Mat, Precision,
    Result,
};

/// Whether an [`ActLinear`] of this kind runs fused (where the device and shape allow): gated layers
/// only. In the towers (H200, docs/PERF.md v0.11–v0.12, each an A/B on the same inputs) the gated kernel
/// beat cuBLASLt + the gate pass (gemma4 b8 57.5 → 55.2 ms, glm5_next b8 117.1 → 115.0 ms), and more since
/// v0.12's epilogue fix (glm5_next b8 116.4 → 114.6 ms against the v0.11 kernel, its GEMMs 60.2 → 56.0 ms),
/// while the plain one still only ties on step3p7's fc1 (728 b8 179.3 → 179.0 ms, b1 23.0 → 23.4 ms, tiles
/// 59.4 → 59.8 ms): the quick_gelu pass it removes (14.2 ms at b8) comes back as GEMM time (+14.4 ms),
/// though in the harness it runs 1.07–1.15× faster than cuBLASLt + the pass.
pub fn fuses(act: &FusedAct) -> bool {
    matches!(act, FusedAct::Gated(_))
}

/// See the module docs.
#[derive(Debug)]
pub struct ActLinear {
    w: GemmBuffer,
    bias: Option<GemmBuffer>,
    /// W's rows (gated: gate and up together) and columns.
    n: usize,
    k: usize,
    act: FusedAct,
    fused: bool,
}

impl ActLinear {
    /// Uploads `W [n, k]` (gated: the stacked `[gate; up]`, `n = 2·width`) and its bias `[n]` in precision
    /// `p`, in the fused kernel's layout where [`fuses`] and [`Device::fused_gemm_supports`] hold in the
    /// bf16 product mode, else as given.
    #[allow(clippy::too_many_arguments)]
    pub fn upload(
        st: &mut Stager,
        dev: &Device,
        p: Precision,
        w: &dyn HostSource,
        bias: Option<&[f32]>,
        n: usize,
        k: usize,
        act: FusedAct,
    ) -> Result<ActLinear> {
        if Some(w.len()) != n.checked_mul(k) || bias.is_some_and(|b| b.len() != n) {
            return Err(GpuError::shape(
                "ActLinear::upload",
                format!(
                    "W has {} values and the bias {:?}, {n}×{k} needs {} and {n}",
                    w.len(),
                    bias.map(<[f32]>::len),
                    n.saturating_mul(k)
                ),
            ));
        }
        let fused = p == Precision::Bf16 && fuses(&act) && dev.fused_gemm_supports(&act, n, k);
        let (w, bias) = if fused && matches!(act, FusedAct::Gated(_)) {
            let view = InterleavedGateUp::new(w, n / 2, k)?;
            let b = bias
                .map(|b| crate::interleave_gate_up(b, n / 2, 1))
                .transpose()?;
            (st.upload_gemm(dev, p, &view)?, b)
        } else {
            (st.upload_gemm(dev, p, w)?, bias.map(<[f32]>::to_vec))
        };
        Ok(ActLinear {
            w,
            bias: GemmBuffer::upload_opt(dev, p, bias.as_deref())?,
            n,
            k,
            act,
            fused,
        })
    }

    /// Whether it runs as the fused kernel.
    pub fn fused(&self) -> bool {
        self.fused
    }

    /// Columns of the output: W's rows, half of them when gated.
    pub fn out_cols(&self) -> usize {
        match self.act {
            FusedAct::Plain { .. } => self.n,
            FusedAct::Gated(_) => self.n / 2,
        }
    }

    /// Bytes on the device (weight and bias).
    pub fn bytes(&self) -> usize {
        self.w.bytes() + self.bias.as_ref().map_or(0, GemmBuffer::bytes)
    }

    /// `out [rows, out_cols] = act(x [rows, k]·Wᵀ + b)` (both dense). The two-step path of a gated
    /// layer writes the GEMM's `[rows, n]` into `scratch` first (None: an error there); a plain one
    /// applies the activation in place in `out`.
    pub fn run(
        &self,
        dev: &Device,
        x: &GemmBuffer,
        rows: usize,
        scratch: Option<&mut GemmBuffer>,
        out: &mut GemmBuffer,
    ) -> Result<()> {
        let (xm, om) = (Mat::dense(rows, self.k), Mat::dense(rows, self.out_cols()));
        let bias = self.bias.as_ref().map(GemmBuffer::bias);
        if self.fused {
            return match (x, &self.w, out) {
                (GemmBuffer::Bf16(x), GemmBuffer::Bf16(w), GemmBuffer::Bf16(y)) => {
                    dev.gemm_act(x, xm, w, self.n, bias, y, om, self.act)
                }
                _ => Err(GpuError::shape(
                    "ActLinear::run",
                    "the fused layer runs on bf16 buffers only",
                )),
            };
        }
        let shape = GemmShape::dense(rows, self.n, self.k);
        let inputs = GemmBuffer::inputs(x, &self.w)?;
        match self.act {
            FusedAct::Plain { act, input, output } => {
                dev.gemm(inputs, bias, out.out(), shape, Epilogue::None)?;
                dev.act_in_place_mixed(out, om, act, input, output)
            }
            FusedAct::Gated(g) => {
                let Some(s) = scratch else {
                    return Err(GpuError::shape(
                        "ActLinear::run",
                        "the two-step gated path needs a [rows, 2·width] scratch buffer",
                    ));
                };
                dev.gemm(inputs, bias, s.out(), shape, Epilogue::None)?;
                let w = self.n / 2;
                let (gm, um) = (
                    Mat::strided(rows, w, self.n, 0),
                    Mat::strided(rows, w, self.n, w),
                );
                dev.gated_act_mixed(out, om, s, gm, s, um, g)
            }
        }
    }
}
