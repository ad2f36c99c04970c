//! Launchers of `kernels/act.cu`: gated and plain activations with their clamps, and the f32 →
//! bf16 / f16 casts; [`ActElem`], the element types of the activation-side kernels (also rope and
//! attention), and [`HalfElem`], the 16-bit GEMM input types.

use cudarc::driver::{LaunchConfig, PushKernelArg};
use half::{bf16, f16};

use super::common::{all_aligned, need_len, off, Clamp, Mat};
use super::norm::NormOut;
use crate::device::{grid_stride, DeviceBuffer, Elem};
use crate::kernels::Kernel;
use crate::{Activation, Device, GpuError, Result};

/// The kernels' `mode` argument for an activation (`act_math.cuh`'s switch).
pub(crate) fn act_mode(act: Activation) -> i32 {
    match act {
        Activation::GeluTanh => 0,
        Activation::QuickGelu => 1,
        Activation::GeluErf => 2,
        Activation::Silu => 3,
        Activation::Identity => 4,
    }
}

/// Gated activation parameters: `out = clamp_o(act(clamp_g(min(g, gate_limit))) · clamp_u(u))`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gate {
    /// The activation applied to the gate.
    pub act: Activation,
    /// `min(g, gate_limit)` before the activation (glm SwiGLU: L; else +∞).
    pub gate_limit: f32,
    /// Clamp of the gate input (gemma4 gate_proj output clamp).
    pub gate: Clamp,
    /// Clamp of the up input (glm SwiGLU: [−L, L]; gemma4 up_proj output clamp).
    pub up: Clamp,
    /// Clamp of the product (gemma4 down_proj input clamp).
    pub out: Clamp,
}

impl Gate {
    /// `act(g)·u`, no clamps.
    pub fn plain(act: Activation) -> Self {
        Gate {
            act,
            gate_limit: f32::INFINITY,
            gate: Clamp::NONE,
            up: Clamp::NONE,
            out: Clamp::NONE,
        }
    }
    /// glm5_next's `silu(min(g, L)) · clamp(u, −L, L)`.
    pub fn swiglu_clamped(limit: f32) -> Self {
        Gate {
            act: Activation::Silu,
            gate_limit: limit,
            gate: Clamp::NONE,
            up: Clamp::new(-limit, limit),
            out: Clamp::NONE,
        }
    }
}

/// Which attention kernels an [`ActElem`] runs on ([`Device::flash_attn`]).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnDtype {
    /// The exact CUDA-core kernel.
    F32,
    /// The bf16 tensor-core kernels (compute capability 8.0 and newer).
    Bf16,
    /// The f16 tensor-core kernels (every tier; Turing's own there).
    F16,
}

/// Element types of the activation-side kernels ([`Device::gated_act`], [`Device::act`],
/// [`Device::qk_norm_rope`], [`Device::flash_attn`]): bf16 or f16 (the product paths) or f32 (the
/// exactness path). Inputs and outputs share the type; the math is f32 in all three.
pub trait ActElem: Elem {
    #[doc(hidden)]
    const GATED_ACT: Kernel;
    #[doc(hidden)]
    const ACT: Kernel;
    #[doc(hidden)]
    const QK_NORM_ROPE: Kernel;
    #[doc(hidden)]
    const QK_NORM_ROPE_STAGED: Kernel;
    #[doc(hidden)]
    const ATTN: AttnDtype;
}
impl ActElem for f32 {
    const GATED_ACT: Kernel = Kernel::GatedActF32;
    const ACT: Kernel = Kernel::ActF32;
    const QK_NORM_ROPE: Kernel = Kernel::QkNormRopeF32;
    const QK_NORM_ROPE_STAGED: Kernel = Kernel::QkNormRopeStagedF32;
    const ATTN: AttnDtype = AttnDtype::F32;
}
impl ActElem for bf16 {
    const GATED_ACT: Kernel = Kernel::GatedActBf16;
    const ACT: Kernel = Kernel::ActBf16;
    const QK_NORM_ROPE: Kernel = Kernel::QkNormRopeBf16;
    const QK_NORM_ROPE_STAGED: Kernel = Kernel::QkNormRopeStagedBf16;
    const ATTN: AttnDtype = AttnDtype::Bf16;
}
impl ActElem for f16 {
    const GATED_ACT: Kernel = Kernel::GatedActF16;
    const ACT: Kernel = Kernel::ActF16;
    const QK_NORM_ROPE: Kernel = Kernel::QkNormRopeF16;
    const QK_NORM_ROPE_STAGED: Kernel = Kernel::QkNormRopeStagedF16;
    const ATTN: AttnDtype = AttnDtype::F16;
}

/// The 16-bit GEMM input types, bf16 and f16: the f32 cast into them, the layout gathers that feed
/// their GEMMs ([`Device::block_gather_2x2`], [`Device::im2col_3x3s2`]), and the host conversions
/// (round to nearest even).
pub trait HalfElem: ActElem + NormOut {
    #[doc(hidden)]
    const CAST_F32: Kernel;
    #[doc(hidden)]
    const BLOCK_GATHER_2X2: Kernel;
    #[doc(hidden)]
    const IM2COL_3X3S2: Kernel;
    /// `x` rounded to nearest even.
    fn from_f32(x: f32) -> Self;
    /// The value as f32 (exact).
    fn to_f32(self) -> f32;
}
impl HalfElem for bf16 {
    const CAST_F32: Kernel = Kernel::CastF32Bf16;
    const BLOCK_GATHER_2X2: Kernel = Kernel::BlockGather2x2Bf16;
    const IM2COL_3X3S2: Kernel = Kernel::Im2col3x3s2Bf16;
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
}
impl HalfElem for f16 {
    const CAST_F32: Kernel = Kernel::CastF32F16;
    const BLOCK_GATHER_2X2: Kernel = Kernel::BlockGather2x2F16;
    const IM2COL_3X3S2: Kernel = Kernel::Im2col3x3s2F16;
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
}

/// Threads and 16-byte chunks per thread of the vectorised elementwise kernels (`ACT_THREADS`,
/// `ACT_UNROLL` in kernels/act.cu).
const ACT_THREADS: usize = 256;
const ACT_UNROLL: usize = 2;

/// Launch of `gated_act` / `act`: the 16-byte vector path when every row start is 16-byte aligned
/// (columns, strides and offsets multiples of 16 bytes) and the chunk count fits 31 bits; otherwise
/// the scalar grid-stride loop. Returns the config and the kernels' `vec` flag.
fn elementwise_cfg<T: Elem>(
    rows: usize,
    cols: usize,
    lds: &[usize],
    addrs: &[u64],
) -> (LaunchConfig, i32) {
    let n = 16 / std::mem::size_of::<T>();
    let chunks = rows * (cols / n);
    let vec = cols.is_multiple_of(n)
        && lds.iter().all(|l| l.is_multiple_of(n))
        && all_aligned(addrs, 16)
        && chunks <= i32::MAX as usize;
    if vec {
        let blocks = chunks.div_ceil(ACT_THREADS * ACT_UNROLL).max(1);
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (ACT_THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        (cfg, 1)
    } else {
        (grid_stride(rows * cols), 0)
    }
}

impl Device {
    /// Gated activation `out = act(gate)·up` (see [`Gate`]), f32, bf16 or f16; gate and up may be column
    /// blocks of one buffer.
    pub fn gated_act<T: ActElem>(
        &self,
        out: &mut DeviceBuffer<T>,
        om: Mat,
        gate: &DeviceBuffer<T>,
        gm: Mat,
        up: &DeviceBuffer<T>,
        um: Mat,
        g: Gate,
    ) -> Result<()> {
        const OP: &str = "gated_act";
        om.check(OP, "out", out)?;
        gm.check(OP, "gate", gate)?;
        um.check(OP, "up", up)?;
        if (gm.rows, gm.cols) != (om.rows, om.cols) || (um.rows, um.cols) != (om.rows, om.cols) {
            return Err(GpuError::shape(
                OP,
                format!(
                    "gate {}×{}, up {}×{}, out {}×{}",
                    gm.rows, gm.cols, um.rows, um.cols, om.rows, om.cols
                ),
            ));
        }
        let (oa, ga, ua) = (
            off(out, om.offset),
            off(gate, gm.offset),
            off(up, um.offset),
        );
        let (cfg, vec) =
            elementwise_cfg::<T>(om.rows, om.cols, &[om.ld, gm.ld, um.ld], &[oa, ga, ua]);
        let (rows, cols, ldo, ldg, ldu, mode) = (
            om.rows as i64,
            om.cols as i32,
            om.ld as i64,
            gm.ld as i64,
            um.ld as i64,
            act_mode(g.act),
        );
        self.launch(T::GATED_ACT, cfg, |b| {
            b.arg(&oa)
                .arg(&ga)
                .arg(&ua)
                .arg(&rows)
                .arg(&cols)
                .arg(&ldo)
                .arg(&ldg)
                .arg(&ldu)
                .arg(&mode)
                .arg(&g.gate_limit);
            b.arg(&g.gate.lo)
                .arg(&g.gate.hi)
                .arg(&g.up.lo)
                .arg(&g.up.hi)
                .arg(&g.out.lo)
                .arg(&g.out.hi)
                .arg(&vec);
        })
    }

    /// Plain activation `out = clamp_o(act(clamp_i(x)))`, f32, bf16 or f16 (in place when `out` and `x`
    /// are the same buffer: use [`Device::act_in_place`]).
    #[allow(clippy::too_many_arguments)]
    pub fn act<T: ActElem>(
        &self,
        out: &mut DeviceBuffer<T>,
        om: Mat,
        x: &DeviceBuffer<T>,
        xm: Mat,
        act: Activation,
        input: Clamp,
        output: Clamp,
    ) -> Result<()> {
        const OP: &str = "act";
        om.check(OP, "out", out)?;
        xm.check(OP, "x", x)?;
        if (xm.rows, xm.cols) != (om.rows, om.cols) {
            return Err(GpuError::shape(
                OP,
                format!("x {}×{} vs out {}×{}", xm.rows, xm.cols, om.rows, om.cols),
            ));
        }
        self.act_raw::<T>(
            off(out, om.offset),
            om,
            off(x, xm.offset),
            xm,
            act,
            input,
            output,
        )
    }

    /// In-place plain activation on `x` (f32, bf16 or f16).
    pub fn act_in_place<T: ActElem>(
        &self,
        x: &mut DeviceBuffer<T>,
        xm: Mat,
        act: Activation,
        input: Clamp,
        output: Clamp,
    ) -> Result<()> {
        xm.check("act_in_place", "x", x)?;
        let a = off(x, xm.offset);
        self.act_raw::<T>(a, xm, a, xm, act, input, output)
    }

    #[allow(clippy::too_many_arguments)]
    fn act_raw<T: ActElem>(
        &self,
        oa: u64,
        om: Mat,
        xa: u64,
        xm: Mat,
        act: Activation,
        i: Clamp,
        o: Clamp,
    ) -> Result<()> {
        let (cfg, vec) = elementwise_cfg::<T>(om.rows, om.cols, &[om.ld, xm.ld], &[oa, xa]);
        let (rows, cols, ldo, ldx, mode) = (
            om.rows as i64,
            om.cols as i32,
            om.ld as i64,
            xm.ld as i64,
            act_mode(act),
        );
        self.launch(T::ACT, cfg, |b| {
            b.arg(&oa)
                .arg(&xa)
                .arg(&rows)
                .arg(&cols)
                .arg(&ldo)
                .arg(&ldx)
                .arg(&mode)
                .arg(&i.lo)
                .arg(&i.hi)
                .arg(&o.lo)
                .arg(&o.hi)
                .arg(&vec);
        })
    }

    /// Dense f32 → bf16 conversion of the first `x.len()` elements.
    pub fn cast_f32_bf16(&self, x: &DeviceBuffer<f32>, out: &mut DeviceBuffer<bf16>) -> Result<()> {
        self.cast_f32_half(x, out)
    }

    /// Dense f32 → f16 conversion of the first `x.len()` elements (round to nearest even; beyond
    /// ±65504 the result is ±∞, as `__float2half_rn` gives).
    pub fn cast_f32_f16(&self, x: &DeviceBuffer<f32>, out: &mut DeviceBuffer<f16>) -> Result<()> {
        self.cast_f32_half(x, out)
    }

    /// Dense f32 → bf16 or f16 conversion of the first `x.len()` elements.
    pub fn cast_f32_half<T: HalfElem>(
        &self,
        x: &DeviceBuffer<f32>,
        out: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        need_len(T::CAST_F32.name(), "out", out, x.len())?;
        let (oa, xa, n) = (out.addr(), x.addr(), x.len() as i64);
        self.launch(T::CAST_F32, grid_stride(x.len()), |b| {
            b.arg(&oa).arg(&xa).arg(&n);
        })
    }
}
