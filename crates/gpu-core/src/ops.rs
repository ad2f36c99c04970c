//! Shape-checked launchers for the PTX kernels (one method per operation on [`Device`]).
#![allow(clippy::too_many_arguments, clippy::type_complexity)]
use cudarc::driver::{LaunchConfig, PushKernelArg};
use half::bf16;

use crate::device::{grid_stride, opt_addr, DeviceBuffer, Elem};
use crate::kernels::Kernel;
use crate::{Device, GpuError, Result};

/// Gated or plain activation; the numbers are the kernels' `mode` argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `0.5x(1+tanh(√(2/π)(x+0.044715x³)))` (`gelu_pytorch_tanh`).
    GeluTanh,
    /// `x·σ(1.702x)` (`quick_gelu`, `gelu_quick`).
    QuickGelu,
    /// `0.5x(1+erf(x/√2))` (`nn.GELU()`).
    GeluErf,
    /// `x·σ(x)`.
    Silu,
    /// `x` (with clamps: a plain clamp).
    Identity,
}

impl Activation {
    pub(crate) fn mode(self) -> i32 {
        match self {
            Activation::GeluTanh => 0,
            Activation::QuickGelu => 1,
            Activation::GeluErf => 2,
            Activation::Silu => 3,
            Activation::Identity => 4,
        }
    }
}

/// A closed interval `[lo, hi]`; [`Clamp::NONE`] is (−∞, ∞). gemma4's clipped linears, glm's SwiGLU limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Clamp {
    /// Lower bound.
    pub lo: f32,
    /// Upper bound.
    pub hi: f32,
}

impl Clamp {
    /// No clamping.
    pub const NONE: Clamp = Clamp {
        lo: f32::NEG_INFINITY,
        hi: f32::INFINITY,
    };
    /// `[lo, hi]`.
    pub fn new(lo: f32, hi: f32) -> Self {
        Clamp { lo, hi }
    }
}

impl Default for Clamp {
    fn default() -> Self {
        Clamp::NONE
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

/// A row-major matrix inside a buffer: `rows × cols`, row stride `ld`, starting at `offset` (elements).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mat {
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Row stride (≥ cols).
    pub ld: usize,
    /// Offset of element (0, 0).
    pub offset: usize,
}

impl Mat {
    /// Dense `rows × cols` at offset 0.
    pub fn dense(rows: usize, cols: usize) -> Self {
        Mat {
            rows,
            cols,
            ld: cols,
            offset: 0,
        }
    }
    /// The same with another row stride and offset.
    pub fn strided(rows: usize, cols: usize, ld: usize, offset: usize) -> Self {
        Mat {
            rows,
            cols,
            ld,
            offset,
        }
    }
    fn check<T: Elem>(&self, op: &'static str, what: &str, b: &DeviceBuffer<T>) -> Result<()> {
        self.check_len(op, what, T::NAME, b.len())
    }

    /// The matrix's extent against a buffer of `len` elements of type `elem`, in checked
    /// arithmetic: every launch's SAFETY argument rests on this, so a sum or product that would
    /// wrap (in a release build) is an error, never a small number that fits. The kernels take
    /// the column count as an i32.
    pub(crate) fn check_len(
        &self,
        op: &'static str,
        what: &str,
        elem: &str,
        len: usize,
    ) -> Result<()> {
        if self.rows == 0 || self.cols == 0 {
            return Err(GpuError::shape(
                op,
                format!("{what}: empty {}×{}", self.rows, self.cols),
            ));
        }
        if self.ld < self.cols {
            return Err(GpuError::shape(
                op,
                format!("{what}: row stride {} < {} columns", self.ld, self.cols),
            ));
        }
        if self.cols > i32::MAX as usize {
            return Err(GpuError::shape(
                op,
                format!("{what}: {} columns exceed i32", self.cols),
            ));
        }
        let need = (self.rows - 1)
            .checked_mul(self.ld)
            .and_then(|n| n.checked_add(self.offset))
            .and_then(|n| n.checked_add(self.cols));
        let Some(need) = need.filter(|&n| n <= len) else {
            return Err(GpuError::shape(
                op,
                format!(
                    "{what}: {}×{} {elem} (stride {}, offset {}) needs {} elements, buffer has {len}",
                    self.rows,
                    self.cols,
                    self.ld,
                    self.offset,
                    need.map_or("more than usize::MAX".to_string(), |n| n.to_string()),
                ),
            ));
        };
        debug_assert!(need <= len);
        Ok(())
    }
}

/// `dims` multiplied in checked arithmetic: a product that would wrap is an error naming the
/// operand, not a small number that passes a length check.
pub(crate) fn product(op: &'static str, what: &str, dims: &[usize]) -> Result<usize> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| GpuError::shape(op, format!("{what}: {dims:?} elements overflow usize")))
}

/// A size the kernels take as an i32, converted, or an error naming it.
pub(crate) fn to_i32(op: &'static str, what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| GpuError::shape(op, format!("{what} = {v} exceeds i32")))
}

fn need_len<T: Elem>(op: &'static str, what: &str, b: &DeviceBuffer<T>, need: usize) -> Result<()> {
    if b.len() < need {
        return Err(GpuError::shape(
            op,
            format!(
                "{what}: needs {need} {} elements, buffer has {}",
                T::NAME,
                b.len()
            ),
        ));
    }
    Ok(())
}

fn off<T: Elem>(b: &DeviceBuffer<T>, offset: usize) -> u64 {
    b.addr() + (offset * std::mem::size_of::<T>()) as u64
}

/// Output element types of the norm kernels (f32 or bf16).
pub trait NormOut: Elem {
    #[doc(hidden)]
    const RMS: Kernel;
    #[doc(hidden)]
    const LN: Kernel;
}
impl NormOut for f32 {
    const RMS: Kernel = Kernel::RmsNormF32;
    const LN: Kernel = Kernel::LayerNormF32;
}
impl NormOut for bf16 {
    const RMS: Kernel = Kernel::RmsNormBf16;
    const LN: Kernel = Kernel::LayerNormBf16;
}

/// Element types of the activation-side kernels ([`Device::gated_act`], [`Device::act`],
/// [`Device::qk_norm_rope`], [`Device::flash_attn`]): bf16 (the product path) or f32 (the exactness
/// path). Inputs and outputs share the type; the math is f32 in both.
pub trait ActElem: Elem {
    #[doc(hidden)]
    const GATED_ACT: Kernel;
    #[doc(hidden)]
    const ACT: Kernel;
    #[doc(hidden)]
    const QK_NORM_ROPE: Kernel;
    #[doc(hidden)]
    const QK_NORM_ROPE_STAGED: Kernel;
    /// f32: the exact CUDA-core attention kernel; bf16: `None` (tensor-core kernels per head dim).
    #[doc(hidden)]
    const EXACT_ATTN: Option<Kernel>;
}
impl ActElem for f32 {
    const GATED_ACT: Kernel = Kernel::GatedActF32;
    const ACT: Kernel = Kernel::ActF32;
    const QK_NORM_ROPE: Kernel = Kernel::QkNormRopeF32;
    const QK_NORM_ROPE_STAGED: Kernel = Kernel::QkNormRopeStagedF32;
    const EXACT_ATTN: Option<Kernel> = Some(Kernel::FlashAttnF32);
}
impl ActElem for bf16 {
    const GATED_ACT: Kernel = Kernel::GatedActBf16;
    const ACT: Kernel = Kernel::ActBf16;
    const QK_NORM_ROPE: Kernel = Kernel::QkNormRopeBf16;
    const QK_NORM_ROPE_STAGED: Kernel = Kernel::QkNormRopeStagedBf16;
    const EXACT_ATTN: Option<Kernel> = None;
}

/// Largest head dimension of the f32 attention kernel (`flash_attn_f32`).
pub const MAX_F32_ATTN_HEAD_DIM: usize = 128;
/// `flash_attn_f32`'s query rows per block (`ATT_BQ`) and shared K+V rows (`2·ATT_BK`).
const F32_ATTN_ROWS: usize = 32;
const F32_ATTN_KEYS: usize = 64;

const NORM_THREADS: u32 = 256;
/// Columns one warp of the row kernels holds in registers (`NORM_NV`·4 per lane, kernels/norm.cu).
const NORM_WARP_COLS: usize = 12 * 4 * 32;
/// Rows up to this width fit the norm kernels' registers (8 warps per row).
pub const MAX_NORM_WIDTH: usize = 12 * 1024;

/// Launch of the row kernels (rms_norm, layer_norm, residual_rms_add): `rw` warps per row, the fewest
/// of 1, 2, 4, 8 whose registers hold `h` columns; blocks of max(64, 32·rw) threads (at most
/// `NORM_THREADS`), so 2 rows per block for rw = 1, else 1: small blocks let the register-heavy row
/// kernels fill each SM to its register limit and free a block's slots as soon as its rows finish.
/// Returns `rw`.
fn row_cfg(rows: usize, h: usize) -> (LaunchConfig, i32) {
    let mut rw = 1;
    while rw * NORM_WARP_COLS < h {
        rw *= 2;
    }
    let threads = (32 * rw).max(64).min(NORM_THREADS as usize);
    let rows_per_block = threads / 32 / rw;
    let cfg = LaunchConfig {
        grid_dim: (rows.div_ceil(rows_per_block) as u32, 1, 1),
        block_dim: (threads as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    (cfg, rw as i32)
}

/// Whether every device address is a multiple of `bytes` (null counts as aligned).
fn all_aligned(addrs: &[u64], bytes: u64) -> bool {
    addrs.iter().all(|a| a % bytes == 0)
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

/// Vector path flag of rms_norm / layer_norm: 16-byte loads of x (and of the weight / bias) and
/// 16-byte (f32) or 8-byte (bf16) stores of y; needs widths, strides and offsets multiples of 4.
fn norm_vec<O: Elem>(xm: Mat, ym: Mat, in_addrs: &[u64], ya: u64) -> i32 {
    (xm.cols.is_multiple_of(4)
        && xm.ld.is_multiple_of(4)
        && ym.ld.is_multiple_of(4)
        && all_aligned(in_addrs, 16)
        && all_aligned(&[ya], 4 * std::mem::size_of::<O>() as u64)) as i32
}

/// Chunks per thread of the staged qk_norm_rope kernel (`QKR_MAXC`, kernels/rope.cu).
const QKR_MAXC: usize = 4;
/// Dynamic shared memory the staged kernel may use per block (the default limit, no opt-in).
const QKR_SMEM_BYTES: usize = 48 * 1024;

/// Shared floats per (token, part) unit of `qk_norm_rope_staged_*` (layout in kernels/rope.cu):
/// A, B, P `[hd]`, cos and sin `[hd/2]`, inv `[heads]`, psum `[heads·hd/vw]`, vals
/// `[heads·(hd + hd/8 + 1)]`, rounded up to a multiple of 4.
fn qkr_unit_floats(heads: usize, hd: usize, vw: usize) -> usize {
    (3 * hd + hd + heads + heads * (hd / vw) + heads * (hd + hd / 8 + 1)).next_multiple_of(4)
}

fn check_width(op: &'static str, h: usize, rows: usize) -> Result<()> {
    if h == 0 || h > MAX_NORM_WIDTH {
        return Err(GpuError::shape(
            op,
            format!("row width {h} outside 1..={MAX_NORM_WIDTH}"),
        ));
    }
    if rows == 0 || rows > i32::MAX as usize {
        return Err(GpuError::shape(op, format!("{rows} rows")));
    }
    Ok(())
}

/// Rope pair layouts (see `kernels/README.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeLayout {
    /// gemma4: two halves, NeoX pairs `(d, d + hd/4)` inside each; first half by x (column), second by y.
    Gemma4,
    /// glm5_next / glm_ocr: NeoX over the full head, pairs `(d, d + hd/2)`; cos `[h, w, h, w]`
    /// (the first quarter's angles from the row y, the second's from the column x).
    Glm,
    /// step3p7, HF (permuted q/k weights): NeoX over the full head with cos `[col, row, col, row]`.
    Step3p7Hf,
    /// step3p7, vendor weights (`attn.in_proj_weight`): interleaved pairs `(2i, 2i+1)`, first hd/2 dims by column.
    Step3p7Vendor,
}

impl RopeLayout {
    pub(crate) fn codes(self) -> (i32, i32) {
        // (layout, first_axis: 0 = x first, 1 = y first)
        match self {
            RopeLayout::Gemma4 => (1, 0),
            RopeLayout::Glm => (0, 1),
            RopeLayout::Step3p7Hf => (0, 0),
            RopeLayout::Step3p7Vendor => (2, 0),
        }
    }
}

/// Rope inverse frequencies `θ^(−2i/(hd/2))`, i < hd/4, computed in f64 and rounded to f32.
pub fn rope_inv_freq(head_dim: usize, theta: f64) -> Vec<f32> {
    let half = (head_dim / 2) as f64;
    (0..head_dim / 4)
        .map(|i| (1.0 / theta.powf(2.0 * i as f64 / half)) as f32)
        .collect()
}

/// Where q, k and v live in the fused qkv buffer and what to do to each (per head).
#[derive(Debug, Clone, Copy)]
pub struct QkvSpec<'a> {
    /// Tokens.
    pub tokens: usize,
    /// Heads (same for q, k, v).
    pub heads: usize,
    /// Head dimension (multiple of 4, ≤ 256).
    pub head_dim: usize,
    /// Row stride of the qkv buffer (elements), e.g. 3·heads·head_dim.
    pub ld: usize,
    /// Column offsets of q, k and v inside a row.
    pub offsets: [usize; 3],
    /// Per-head RMSNorm weights for q and k (`None` = weightless); only used where `norm` says so.
    pub q_weight: Option<&'a DeviceBuffer<f32>>,
    /// See `q_weight`.
    pub k_weight: Option<&'a DeviceBuffer<f32>>,
    /// Which of q, k, v get a per-head RMSNorm (gemma4: all three, v weightless; glm: q and k).
    pub norm: [bool; 3],
    /// RMSNorm epsilon.
    pub eps: f32,
    /// Clamps applied to q, k, v on read (gemma4 clipped q/k/v output clamps).
    pub clamps: [Clamp; 3],
}

/// Rope of q and k (positions are `[tokens, 2]` i32 as (x = column, y = row)).
#[derive(Debug, Clone, Copy)]
pub struct RopeSpec<'a> {
    /// Pair layout.
    pub layout: RopeLayout,
    /// Positions `[tokens, 2]` (x, y).
    pub pos: &'a DeviceBuffer<i32>,
    /// `rope_inv_freq(head_dim, θ)`, `[head_dim/4]`.
    pub inv_freq: &'a DeviceBuffer<f32>,
}

/// Flash-attention variant (bf16). `M*`: mma.sync kernels (any sm_80+ device), 16-row m-tiles per warp,
/// 4 warps per block. `Ws*`: the sm_90a warp-specialised kernels (compute capability 9.0 only): a producer
/// warpgroup streams K and V tiles with the tensor copy engine into a 3-stage ring, consumer warpgroups of
/// 64 query rows run wgmma and the softmax (kernels/flash_attn_sm90a.cu).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlashVariant {
    /// 1 m-tile per warp: 64 query rows per block.
    M1,
    /// 2 m-tiles per warp: 128 query rows per block.
    M2,
    /// Warp-specialised, 2 consumer warpgroups: 128 query rows per block.
    Ws2,
    /// Warp-specialised, 3 consumer warpgroups: 192 query rows per block.
    Ws3,
}

/// One warp-specialised attention kernel: its consumer warpgroups, key tile and pipeline depth, exactly as
/// instantiated by `FLASH_WS_ENTRY(HD, HDP, C, BN, ST, 1)` in kernels/flash_attn_sm90a.cu.
#[derive(Debug, Clone, Copy)]
struct WsConfig {
    kernel: Kernel,
    consumers: usize,
    key_tile: usize,
    stages: usize,
}

impl WsConfig {
    fn new(head_dim: usize, variant: FlashVariant) -> Option<Self> {
        let (kernel, consumers, key_tile) = match (head_dim, variant) {
            (64, FlashVariant::Ws3) => (Kernel::FlashAttnWsHd64C3Bf16, 3, 128),
            (64, FlashVariant::Ws2) => (Kernel::FlashAttnWsHd64C2Bf16, 2, 192),
            (72, FlashVariant::Ws3) => (Kernel::FlashAttnWsHd72C3Bf16, 3, 96),
            (72, FlashVariant::Ws2) => (Kernel::FlashAttnWsHd72C2Bf16, 2, 128),
            (96, FlashVariant::Ws3) => (Kernel::FlashAttnWsHd96C3Bf16, 3, 96),
            (96, FlashVariant::Ws2) => (Kernel::FlashAttnWsHd96C2Bf16, 2, 128),
            _ => return None,
        };
        Some(Self {
            kernel,
            consumers,
            key_tile,
            stages: 3,
        })
    }

    /// Query rows per block (64 per consumer warpgroup).
    fn rows(self) -> usize {
        64 * self.consumers
    }

    /// Dynamic shared memory, as `fa_ws::WsSmem<HDP, C, BN, ST>::BYTES` computes it: Q `[NA][BM][128 B]`, K and
    /// V `[ST][NA][BN][128 B]`, 1 + 4·ST mbarriers, 8 bytes per consumer warp, 1024 bytes of alignment slack.
    fn shared_bytes(self, head_dim: usize) -> usize {
        let atoms = head_dim.next_multiple_of(16).div_ceil(64);
        let q = atoms * self.rows() * 128;
        let tile = atoms * self.key_tile * 128;
        q + 2 * self.stages * tile + 8 * (1 + 4 * self.stages) + 8 * 4 * self.consumers + 1024
    }
}

fn no_bf16_attention(head_dim: usize) -> GpuError {
    GpuError::shape(
        "flash_attn",
        format!("head_dim {head_dim} (bf16 kernels exist for 64, 72, 96)"),
    )
}

/// Head-dim-64 throughput of the two warp-specialised kernels when the grid fills many waves (TFLOP/s on the
/// H200, `kernels/dev/fa_ws_bench.cu`, n = 12288): the wave model in [`ws_default`] weighs them.
const WS3_HD64_TFLOPS: f64 = 532.0;
/// See [`WS3_HD64_TFLOPS`].
const WS2_HD64_TFLOPS: f64 = 466.0;

/// The default warp-specialised variant: `Ws3` (192-row blocks, the fastest per SM at every tower shape),
/// except at head dim 64 when 128-row blocks leave fewer idle SMs in the last wave than the throughput
/// difference costs (e.g. glm's 5184 tokens at batch 1: 432 blocks of 192 rows = 3.3 waves of 132 SMs).
fn ws_default(head_dim: usize, cu: &[i32], heads: usize, sms: usize) -> FlashVariant {
    if head_dim != 64 {
        return FlashVariant::Ws3;
    }
    let time = |rows: usize, tflops: f64| {
        let blocks: usize = cu
            .windows(2)
            .map(|w| (w[1] - w[0]) as usize)
            .map(|l| l.div_ceil(rows))
            .sum::<usize>()
            * heads;
        blocks.div_ceil(sms.max(1)) as f64 * rows as f64 / tflops
    };
    if time(128, WS2_HD64_TFLOPS) < time(192, WS3_HD64_TFLOPS) {
        FlashVariant::Ws2
    } else {
        FlashVariant::Ws3
    }
}

/// Arguments of [`Device::flash_attn`]: `o = softmax(scale·q·kᵀ)·v` per head and segment, in bf16
/// (tensor cores) or f32 (exact, CUDA cores).
#[derive(Debug)]
pub struct AttnArgs<'a, T: ActElem = bf16> {
    /// q, k, v: `[tokens, ld]` with head h of token t at `offset + t·ld + h·head_dim`.
    pub q: (&'a DeviceBuffer<T>, Mat),
    /// See `q`.
    pub k: (&'a DeviceBuffer<T>, Mat),
    /// See `q`.
    pub v: (&'a DeviceBuffer<T>, Mat),
    /// Heads.
    pub heads: usize,
    /// Head dimension: bf16 64, 72 or 96; f32 any in 1..=[`MAX_F32_ATTN_HEAD_DIM`].
    pub head_dim: usize,
    /// Segment boundaries `[segments + 1]` on the device.
    pub cu_seqlens: &'a DeviceBuffer<i32>,
    /// The same boundaries on the host (shape checks and the grid).
    pub cu_seqlens_host: &'a [i32],
    /// Softmax scale (gemma4 1.0; others hd^−½).
    pub scale: f32,
    /// bf16 kernel variant; `None` = the default for the head dim. Must be `None` for f32 (one kernel).
    pub variant: Option<FlashVariant>,
}

impl Device {
    /// RMSNorm of `x` rows (f32) into `y` (f32 or bf16): `y = clamp(x·rsqrt(mean(x²)+eps)·w)`; `w = None` is weightless.
    pub fn rms_norm<O: NormOut>(
        &self,
        x: &DeviceBuffer<f32>,
        xm: Mat,
        w: Option<&DeviceBuffer<f32>>,
        y: &mut DeviceBuffer<O>,
        ym: Mat,
        eps: f32,
        clamp: Clamp,
    ) -> Result<()> {
        const OP: &str = "rms_norm";
        xm.check(OP, "x", x)?;
        ym.check(OP, "y", y)?;
        if (xm.rows, xm.cols) != (ym.rows, ym.cols) {
            return Err(GpuError::shape(
                OP,
                format!("x {}×{} vs y {}×{}", xm.rows, xm.cols, ym.rows, ym.cols),
            ));
        }
        check_width(OP, xm.cols, xm.rows)?;
        if let Some(w) = w {
            need_len(OP, "w", w, xm.cols)?;
        }
        let (xa, wa, ya) = (off(x, xm.offset), opt_addr(w), off(y, ym.offset));
        let (cfg, rw) = row_cfg(xm.rows, xm.cols);
        let vec = norm_vec::<O>(xm, ym, &[xa, wa], ya);
        let (rows, h, ldx, ldy) = (xm.rows as i32, xm.cols as i32, xm.ld as i64, ym.ld as i64);
        self.launch(O::RMS, cfg, |b| {
            b.arg(&xa)
                .arg(&wa)
                .arg(&ya)
                .arg(&rows)
                .arg(&h)
                .arg(&ldx)
                .arg(&ldy)
                .arg(&eps)
                .arg(&clamp.lo)
                .arg(&clamp.hi)
                .arg(&rw)
                .arg(&vec);
        })
    }

    /// LayerNorm (two-pass, biased variance) of `x` rows into `y`: `(x − μ)/√(σ² + eps)·w + b`.
    #[allow(clippy::too_many_arguments)]
    pub fn layer_norm<O: NormOut>(
        &self,
        x: &DeviceBuffer<f32>,
        xm: Mat,
        w: Option<&DeviceBuffer<f32>>,
        b: Option<&DeviceBuffer<f32>>,
        y: &mut DeviceBuffer<O>,
        ym: Mat,
        eps: f32,
    ) -> Result<()> {
        const OP: &str = "layer_norm";
        xm.check(OP, "x", x)?;
        ym.check(OP, "y", y)?;
        if (xm.rows, xm.cols) != (ym.rows, ym.cols) {
            return Err(GpuError::shape(
                OP,
                format!("x {}×{} vs y {}×{}", xm.rows, xm.cols, ym.rows, ym.cols),
            ));
        }
        check_width(OP, xm.cols, xm.rows)?;
        for (name, v) in [("w", w), ("b", b)] {
            if let Some(v) = v {
                need_len(OP, name, v, xm.cols)?;
            }
        }
        let (xa, wa, ba, ya) = (
            off(x, xm.offset),
            opt_addr(w),
            opt_addr(b),
            off(y, ym.offset),
        );
        let (cfg, rw) = row_cfg(xm.rows, xm.cols);
        let vec = norm_vec::<O>(xm, ym, &[xa, wa, ba], ya);
        let (rows, h, ldx, ldy) = (xm.rows as i32, xm.cols as i32, xm.ld as i64, ym.ld as i64);
        self.launch(O::LN, cfg, |bld| {
            bld.arg(&xa)
                .arg(&wa)
                .arg(&ba)
                .arg(&ya)
                .arg(&rows)
                .arg(&h)
                .arg(&ldx)
                .arg(&ldy)
                .arg(&eps)
                .arg(&rw)
                .arg(&vec);
        })
    }

    /// `x += scale ⊙ clamp(y)` over dense `x [rows, h]` (f32 residual stream); `scale = None` is 1
    /// (plain residual), `Some` is step3p7's LayerScale. `h % 4 == 0`.
    pub fn residual_add(
        &self,
        x: &mut DeviceBuffer<f32>,
        y: &DeviceBuffer<f32>,
        ym: Mat,
        scale: Option<&DeviceBuffer<f32>>,
        clamp: Clamp,
    ) -> Result<()> {
        const OP: &str = "residual_add";
        ym.check(OP, "y", y)?;
        Mat::dense(ym.rows, ym.cols).check(OP, "x", x)?;
        if !ym.cols.is_multiple_of(4) || !ym.offset.is_multiple_of(4) || !ym.ld.is_multiple_of(4) {
            return Err(GpuError::shape(
                OP,
                format!(
                    "width {}, y stride {} and offset {} must be multiples of 4",
                    ym.cols, ym.ld, ym.offset
                ),
            ));
        }
        if let Some(s) = scale {
            need_len(OP, "scale", s, ym.cols)?;
        }
        let (xa, ya, sa) = (x.addr(), off(y, ym.offset), opt_addr(scale));
        let (rows, h, ldy) = (ym.rows as i64, ym.cols as i32, ym.ld as i64);
        self.launch(
            Kernel::ResidualAddF32,
            grid_stride(ym.rows * ym.cols / 4),
            |b| {
                b.arg(&xa)
                    .arg(&ya)
                    .arg(&sa)
                    .arg(&rows)
                    .arg(&h)
                    .arg(&ldy)
                    .arg(&clamp.lo)
                    .arg(&clamp.hi);
            },
        )
    }

    /// gemma4 sandwich: `x += RMS(clamp(y))·w_post`; then, with `next = Some((w, out, eps))`, also
    /// `out = RMS(x)·w` (bf16, dense) — the next block's pre-norm in the same pass.
    #[allow(clippy::too_many_arguments)]
    pub fn residual_rms_add(
        &self,
        x: &mut DeviceBuffer<f32>,
        y: &DeviceBuffer<f32>,
        ym: Mat,
        w_post: Option<&DeviceBuffer<f32>>,
        eps: f32,
        clamp: Clamp,
        next: Option<(Option<&DeviceBuffer<f32>>, &mut DeviceBuffer<bf16>, f32)>,
    ) -> Result<()> {
        const OP: &str = "residual_rms_add";
        ym.check(OP, "y", y)?;
        let dense = Mat::dense(ym.rows, ym.cols);
        dense.check(OP, "x", x)?;
        check_width(OP, ym.cols, ym.rows)?;
        if let Some(w) = w_post {
            need_len(OP, "w_post", w, ym.cols)?;
        }
        let (nw, no, neps) = match next {
            Some((w, out, e)) => {
                dense.check(OP, "next_out", out)?;
                if let Some(w) = w {
                    need_len(OP, "next_w", w, ym.cols)?;
                }
                (opt_addr(w), out.addr(), e)
            }
            None => (0, 0, 0.0),
        };
        let (xa, ya, wa) = (x.addr(), off(y, ym.offset), opt_addr(w_post));
        let (cfg, rw) = row_cfg(ym.rows, ym.cols);
        // vector path: float4 rows of y and x (x dense), 8-byte bf16 stores into next_out
        let vec = (ym.cols.is_multiple_of(4)
            && ym.ld.is_multiple_of(4)
            && all_aligned(&[xa, ya, wa, nw], 16)
            && all_aligned(&[no], 8)) as i32;
        let (rows, h, ldy) = (ym.rows as i32, ym.cols as i32, ym.ld as i64);
        self.launch(Kernel::ResidualRmsAddF32, cfg, |b| {
            b.arg(&xa)
                .arg(&ya)
                .arg(&wa)
                .arg(&rows)
                .arg(&h)
                .arg(&ldy)
                .arg(&eps)
                .arg(&clamp.lo)
                .arg(&clamp.hi)
                .arg(&nw)
                .arg(&no)
                .arg(&neps)
                .arg(&rw)
                .arg(&vec);
        })
    }

    /// Gated activation `out = act(gate)·up` (see [`Gate`]), f32 or bf16; gate and up may be column
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
            g.act.mode(),
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

    /// Plain activation `out = clamp_o(act(clamp_i(x)))`, f32 or bf16 (in place when `out` and `x`
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

    /// In-place plain activation on `x` (f32 or bf16).
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
            act.mode(),
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
        need_len("cast_f32_bf16", "out", out, x.len())?;
        let (oa, xa, n) = (out.addr(), x.addr(), x.len() as i64);
        self.launch(Kernel::CastF32Bf16, grid_stride(x.len()), |b| {
            b.arg(&oa).arg(&xa).arg(&n);
        })
    }

    /// Per-head RMSNorm of q/k (and v) fused with 2-D rope of q and k, in place on the qkv buffer
    /// (f32 or bf16; math in f32).
    pub fn qk_norm_rope<T: ActElem>(
        &self,
        qkv: &mut DeviceBuffer<T>,
        spec: &QkvSpec<'_>,
        rope: Option<&RopeSpec<'_>>,
    ) -> Result<()> {
        const OP: &str = "qk_norm_rope";
        let s = spec;
        if s.head_dim == 0 || !s.head_dim.is_multiple_of(4) || s.head_dim > 256 {
            return Err(GpuError::shape(
                OP,
                format!("head_dim {} must be a multiple of 4 in 4..=256", s.head_dim),
            ));
        }
        let width = product(OP, "heads × head_dim", &[s.heads, s.head_dim])?;
        to_i32(OP, "heads", s.heads)?;
        for (i, o) in s.offsets.iter().enumerate() {
            Mat::strided(s.tokens, width, s.ld, *o).check(OP, ["q", "k", "v"][i], qkv)?;
        }
        for (name, w, on) in [
            ("q_weight", s.q_weight, s.norm[0]),
            ("k_weight", s.k_weight, s.norm[1]),
        ] {
            if let (Some(w), true) = (w, on) {
                need_len(OP, name, w, s.head_dim)?;
            }
        }
        let mut flags = (s.norm[0] as i32) | (s.norm[1] as i32) << 1 | (s.norm[2] as i32) << 2;
        let (pos, inv, layout, first_axis) = match rope {
            Some(r) => {
                need_len(OP, "pos", r.pos, product(OP, "pos", &[2, s.tokens])?)?;
                need_len(OP, "inv_freq", r.inv_freq, s.head_dim / 4)?;
                flags |= 8;
                let (l, a) = r.layout.codes();
                (r.pos.addr(), r.inv_freq.addr(), l, a)
            }
            None => (0, 0, 0, 0),
        };
        let qw = if s.norm[0] { opt_addr(s.q_weight) } else { 0 };
        let kw = if s.norm[1] { opt_addr(s.k_weight) } else { 0 };
        // parts with work (norm, rope or a clamp); the others are neither read nor written
        let active: Vec<usize> = (0..3)
            .filter(|&w| s.norm[w] || (rope.is_some() && w < 2) || s.clamps[w] != Clamp::NONE)
            .collect();
        if active.is_empty() {
            return Ok(());
        }
        let (qa, n, heads, hd, ld) = (
            qkv.addr(),
            s.tokens as i64,
            s.heads as i32,
            s.head_dim as i32,
            s.ld as i64,
        );
        let [qo, ko, vo] = s.offsets.map(|o| o as i64);
        let c = s.clamps;
        // Staged kernel (kernels/rope.cu): 16-byte chunks of vw elements that never straddle a head,
        // so head_dim, the row stride and the active parts' offsets must be multiples of vw; TX =
        // ceil(heads / QKR_MAXC) heads × hd/vw chunks per unit row, TY units per block within 256
        // threads and the default 48 KB of shared memory.
        let vw = 16 / std::mem::size_of::<T>();
        let staged = if s.head_dim.is_multiple_of(vw)
            && s.ld.is_multiple_of(vw)
            && active.iter().all(|&w| s.offsets[w].is_multiple_of(vw))
            && qa.is_multiple_of(16)
        {
            let tx = s.heads.div_ceil(QKR_MAXC) * (s.head_dim / vw);
            let unit = qkr_unit_floats(s.heads, s.head_dim, vw);
            let ty = (256 / tx.max(1)).min(QKR_SMEM_BYTES / (unit * 4));
            let blocks = s.tokens.div_ceil(ty.max(1));
            (tx <= 256 && ty >= 1 && blocks <= i32::MAX as usize).then_some((tx, ty, unit, blocks))
        } else {
            None
        };
        // the staged kernel takes the same arguments plus the active-part mask and its unit
        let (kernel, cfg, staged_args) = match staged {
            None => (
                T::QK_NORM_ROPE,
                LaunchConfig {
                    grid_dim: ((s.tokens * s.heads * 3).div_ceil(8) as u32, 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                },
                None,
            ),
            Some((tx, ty, unit, blocks)) => (
                T::QK_NORM_ROPE_STAGED,
                LaunchConfig {
                    grid_dim: (blocks as u32, active.len() as u32, 1),
                    block_dim: (tx as u32, ty as u32, 1),
                    shared_mem_bytes: (ty * unit * 4) as u32,
                },
                Some((active.iter().fold(0i32, |m, &w| m | 1 << w), unit as i32)),
            ),
        };
        self.launch(kernel, cfg, |b| {
            b.arg(&qa)
                .arg(&n)
                .arg(&heads)
                .arg(&hd)
                .arg(&ld)
                .arg(&qo)
                .arg(&ko)
                .arg(&vo)
                .arg(&pos)
                .arg(&inv);
            b.arg(&layout)
                .arg(&first_axis)
                .arg(&flags)
                .arg(&qw)
                .arg(&kw)
                .arg(&s.eps);
            b.arg(&c[0].lo)
                .arg(&c[0].hi)
                .arg(&c[1].lo)
                .arg(&c[1].hi)
                .arg(&c[2].lo)
                .arg(&c[2].hi);
            if let Some((mask, unit)) = &staged_args {
                b.arg(mask).arg(unit);
            }
        })
    }

    /// Non-causal variable-length flash attention; writes `o [tokens, heads·head_dim]` (`om`) in the
    /// inputs' type. bf16: tensor-core kernels for head dims 64, 72, 96 (ld and offsets multiples of 8).
    /// f32: one exact CUDA-core kernel (f32 scores, online softmax and P·V), any head dim up to
    /// [`MAX_F32_ATTN_HEAD_DIM`], any strides.
    pub fn flash_attn<T: ActElem>(
        &self,
        a: &AttnArgs<'_, T>,
        o: &mut DeviceBuffer<T>,
        om: Mat,
    ) -> Result<()> {
        const OP: &str = "flash_attn";
        let cu = a.cu_seqlens_host;
        if cu.len() < 2 || cu[0] != 0 || cu.windows(2).any(|w| w[1] < w[0]) {
            return Err(GpuError::shape(
                OP,
                format!("cu_seqlens must start at 0 and not decrease, got {cu:?}"),
            ));
        }
        need_len(OP, "cu_seqlens", a.cu_seqlens, cu.len())?;
        let tokens = cu.last().map_or(0, |&t| t as usize);
        let width = product(OP, "heads × head_dim", &[a.heads, a.head_dim])?;
        let max_len = cu
            .windows(2)
            .map(|w| (w[1] - w[0]) as usize)
            .max()
            .unwrap_or(0);
        // (kernel, 16-byte loads: ld/offset multiple of 8, bf16 variant rows per block)
        let mut ws_cfg: Option<WsConfig> = None;
        let (kernel, align, br, threads, smem) = match T::EXACT_ATTN {
            Some(k) => {
                if a.variant.is_some() {
                    return Err(GpuError::shape(
                        OP,
                        "f32 attention has one kernel: variant must be None",
                    ));
                }
                if a.head_dim == 0 || a.head_dim > MAX_F32_ATTN_HEAD_DIM {
                    return Err(GpuError::shape(
                        OP,
                        format!(
                            "head_dim {} outside 1..={MAX_F32_ATTN_HEAD_DIM} (f32 kernel)",
                            a.head_dim
                        ),
                    ));
                }
                (
                    k,
                    1,
                    F32_ATTN_ROWS,
                    128,
                    (F32_ATTN_ROWS + F32_ATTN_KEYS) * (a.head_dim + 1) * 4,
                )
            }
            None => {
                let segments = cu.len() - 1;
                let ws = self.has_kernel(Kernel::FlashAttnWsHd64C3Bf16);
                // Measured on the H200 (docs/notes/flash-attn-sm90a.md): the warp-specialised kernels are the
                // fastest at every tower shape (336–537 TFLOP/s, 1.17–1.72× cuDNN); without sm_90a, 128-row
                // mma.sync blocks (M2) win once the grid fills the 132 SMs several times over (≥ ~1000
                // blocks), 64-row blocks (M1) below that.
                let many = max_len.div_ceil(128) * a.heads * segments >= 1000;
                let variant = match a.variant {
                    Some(v) => v,
                    None if ws => ws_default(a.head_dim, cu, a.heads, self.multiprocessors()?),
                    None if many => FlashVariant::M2,
                    None => FlashVariant::M1,
                };
                let hdp = a.head_dim.next_multiple_of(16);
                let (kernel, br, threads, smem) = match variant {
                    FlashVariant::M1 | FlashVariant::M2 => {
                        let kernel = match (a.head_dim, variant) {
                            (64, FlashVariant::M1) => Kernel::FlashAttnHd64M1Bf16,
                            (64, _) => Kernel::FlashAttnHd64M2Bf16,
                            (72, FlashVariant::M1) => Kernel::FlashAttnHd72M1Bf16,
                            (72, _) => Kernel::FlashAttnHd72M2Bf16,
                            (96, FlashVariant::M1) => Kernel::FlashAttnHd96M1Bf16,
                            (96, _) => Kernel::FlashAttnHd96M2Bf16,
                            (hd, _) => return Err(no_bf16_attention(hd)),
                        };
                        let br = if variant == FlashVariant::M1 { 64 } else { 128 };
                        // Q [br] + K, V [2 × 64] rows of hdp + 8 bf16 (kernels/flash_attn.cu)
                        (kernel, br, 128, (br + 4 * 64) * (hdp + 8) * 2)
                    }
                    FlashVariant::Ws2 | FlashVariant::Ws3 => {
                        let c = WsConfig::new(a.head_dim, variant)
                            .ok_or_else(|| no_bf16_attention(a.head_dim))?;
                        ws_cfg = Some(c);
                        (
                            c.kernel,
                            c.rows(),
                            128 * (c.consumers as u32 + 1),
                            c.shared_bytes(a.head_dim),
                        )
                    }
                };
                if !self.has_kernel(kernel) {
                    return Err(GpuError::shape(
                        OP,
                        format!("{variant:?} needs an sm_90a device (compute capability 9.0)"),
                    ));
                }
                (kernel, 8, br, threads, smem)
            }
        };
        for (name, (buf, m)) in [("q", a.q), ("k", a.k), ("v", a.v)] {
            if m.rows < tokens || m.cols < width {
                return Err(GpuError::shape(
                    OP,
                    format!(
                        "{name}: {}×{} but cu_seqlens needs {tokens}×{width}",
                        m.rows, m.cols
                    ),
                ));
            }
            m.check(OP, name, buf)?;
            if m.ld % align != 0 || m.offset % align != 0 {
                return Err(GpuError::shape(
                    OP,
                    format!(
                        "{name}: stride {} and offset {} must be multiples of 8 (16-byte loads)",
                        m.ld, m.offset
                    ),
                ));
            }
        }
        let oalign = if align == 1 { 1 } else { 2 };
        if om.rows < tokens
            || om.cols < width
            || !om.ld.is_multiple_of(oalign)
            || !om.offset.is_multiple_of(oalign)
        {
            return Err(GpuError::shape(
                OP,
                format!(
                    "o: {}×{} stride {} offset {} for {tokens}×{width}",
                    om.rows, om.cols, om.ld, om.offset
                ),
            ));
        }
        om.check(OP, "o", o)?;
        if smem > self.smem_optin {
            return Err(GpuError::shape(
                OP,
                format!(
                    "{kernel:?} needs {smem} bytes of shared memory, the device allows {}",
                    self.smem_optin
                ),
            ));
        }
        if max_len == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig {
            grid_dim: (
                max_len.div_ceil(br) as u32,
                a.heads as u32,
                (cu.len() - 1) as u32,
            ),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let (qa, ka, va, oa) = (
            off(a.q.0, a.q.1.offset),
            off(a.k.0, a.k.1.offset),
            off(a.v.0, a.v.1.offset),
            off(o, om.offset),
        );
        let (ql, kl, vl, ol) = (
            a.q.1.ld as i64,
            a.k.1.ld as i64,
            a.v.1.ld as i64,
            om.ld as i64,
        );
        let cua = a.cu_seqlens.addr();
        let scale_log2 = a.scale * std::f32::consts::LOG2_E;
        if let Some(c) = ws_cfg {
            // q rows come in boxes of 64 (one per consumer warpgroup), k and v in key tiles
            let map = |addr: u64, ld: usize, rows: usize| {
                crate::tma::head_major_bf16(addr, a.head_dim, a.heads, tokens, ld, rows as u32)
            };
            let mq = map(qa, a.q.1.ld, 64)?;
            let mk = map(ka, a.k.1.ld, c.key_tile)?;
            let mv = map(va, a.v.1.ld, c.key_tile)?;
            return self.launch(kernel, cfg, |b| {
                b.arg(&mq)
                    .arg(&mk)
                    .arg(&mv)
                    .arg(&oa)
                    .arg(&ol)
                    .arg(&cua)
                    .arg(&scale_log2);
            });
        }
        let hd = a.head_dim as i32;
        let exact = T::EXACT_ATTN.is_some();
        self.launch(kernel, cfg, |b| {
            b.arg(&qa)
                .arg(&ka)
                .arg(&va)
                .arg(&oa)
                .arg(&ql)
                .arg(&kl)
                .arg(&vl)
                .arg(&ol)
                .arg(&cua);
            if exact {
                b.arg(&hd).arg(&a.scale);
            } else {
                b.arg(&scale_log2);
            }
        })
    }

    /// gemma4 position tables: `x[r] += T[0, px] + T[1, py]` (pad rows with a negative position get nothing).
    /// `table` is `[2, t_rows, h]`, `pos` `[rows, 2]` (x, y).
    pub fn pos_add_xy(
        &self,
        x: &mut DeviceBuffer<f32>,
        rows: usize,
        h: usize,
        table: &DeviceBuffer<f32>,
        t_rows: usize,
        pos: &DeviceBuffer<i32>,
    ) -> Result<()> {
        const OP: &str = "pos_add_xy";
        Mat::dense(rows, h).check(OP, "x", x)?;
        need_len(OP, "table", table, product(OP, "table", &[2, t_rows, h])?)?;
        need_len(OP, "pos", pos, product(OP, "pos", &[2, rows])?)?;
        let (xa, ta, pa, n, hh, tr) = (
            x.addr(),
            table.addr(),
            pos.addr(),
            rows as i64,
            to_i32(OP, "h", h)?,
            t_rows as i64,
        );
        // Positions ≥ t_rows would read past the table: the kernel trusts them, so the caller's
        // positions come from the grid (< t_rows by construction); we check on the host side cheaply
        // only via the table length above.
        self.launch(Kernel::PosAddXyF32, grid_stride(rows * h), |b| {
            b.arg(&xa).arg(&ta).arg(&pa).arg(&n).arg(&hh).arg(&tr);
        })
    }

    /// Bilinear resize (align_corners = false) of a `[ih, iw, h]` table to `[oh, ow, h]`.
    #[allow(clippy::too_many_arguments)]
    pub fn bilinear_resize(
        &self,
        input: &DeviceBuffer<f32>,
        ih: usize,
        iw: usize,
        out: &mut DeviceBuffer<f32>,
        oh: usize,
        ow: usize,
        h: usize,
    ) -> Result<()> {
        const OP: &str = "bilinear_resize";
        if [ih, iw, oh, ow, h].contains(&0) {
            return Err(GpuError::shape(OP, "empty grid"));
        }
        need_len(OP, "input", input, product(OP, "input", &[ih, iw, h])?)?;
        let n_out = product(OP, "out", &[oh, ow, h])?;
        need_len(OP, "out", out, n_out)?;
        let (oa, ia) = (out.addr(), input.addr());
        let (a, bb, c, d, e) = (
            to_i32(OP, "ih", ih)?,
            to_i32(OP, "iw", iw)?,
            to_i32(OP, "oh", oh)?,
            to_i32(OP, "ow", ow)?,
            to_i32(OP, "h", h)?,
        );
        self.launch(Kernel::BilinearResizeF32, grid_stride(n_out), |b| {
            b.arg(&oa).arg(&ia).arg(&a).arg(&bb).arg(&c).arg(&d).arg(&e);
        })
    }

    /// k×k average pool of a `[gh, gw, h]` grid to `[gh/k, gw/k, h]`, times `scale`.
    #[allow(clippy::too_many_arguments)]
    pub fn avg_pool(
        &self,
        input: &DeviceBuffer<f32>,
        gh: usize,
        gw: usize,
        k: usize,
        h: usize,
        scale: f32,
        out: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        const OP: &str = "avg_pool";
        if k == 0 || !gh.is_multiple_of(k) || !gw.is_multiple_of(k) || h == 0 {
            return Err(GpuError::shape(
                OP,
                format!("grid {gh}×{gw} not divisible by k = {k}"),
            ));
        }
        need_len(OP, "input", input, product(OP, "input", &[gh, gw, h])?)?;
        let n_out = product(OP, "out", &[gh / k, gw / k, h])?;
        need_len(OP, "out", out, n_out)?;
        let (oa, ia) = (out.addr(), input.addr());
        let (a, bb, c, d) = (
            to_i32(OP, "gh", gh)?,
            to_i32(OP, "gw", gw)?,
            to_i32(OP, "k", k)?,
            to_i32(OP, "h", h)?,
        );
        self.launch(Kernel::AvgPoolF32, grid_stride(n_out), |b| {
            b.arg(&oa)
                .arg(&ia)
                .arg(&a)
                .arg(&bb)
                .arg(&c)
                .arg(&d)
                .arg(&scale);
        })
    }

    /// 2×2 merge gather into `[blocks, 4h]` rows ordered (c, ky, kx). `grid_w = None`: tokens are
    /// block-major (4 consecutive tokens per block, glm); `Some(gw)`: a raster grid of width gw.
    pub fn block_gather_2x2(
        &self,
        input: &DeviceBuffer<bf16>,
        tokens: usize,
        h: usize,
        grid_w: Option<usize>,
        out: &mut DeviceBuffer<bf16>,
    ) -> Result<()> {
        const OP: &str = "block_gather_2x2";
        if !tokens.is_multiple_of(4) || h == 0 {
            return Err(GpuError::shape(
                OP,
                format!("{tokens} tokens is not a multiple of 4"),
            ));
        }
        if let Some(gw) = grid_w {
            if gw == 0 || gw % 2 != 0 || !tokens.is_multiple_of(2 * gw) {
                return Err(GpuError::shape(
                    OP,
                    format!("{tokens} tokens is not a grid of even width {gw} and even height"),
                ));
            }
        }
        let n = product(OP, "tokens × h", &[tokens, h])?;
        need_len(OP, "input", input, n)?;
        need_len(OP, "out", out, n)?;
        let (oa, ia, nb, hh, gw) = (
            out.addr(),
            input.addr(),
            (tokens / 4) as i64,
            to_i32(OP, "h", h)?,
            to_i32(OP, "grid_w", grid_w.unwrap_or(0))?,
        );
        self.launch(Kernel::BlockGather2x2Bf16, grid_stride(n), |b| {
            b.arg(&oa).arg(&ia).arg(&nb).arg(&hh).arg(&gw);
        })
    }

    /// 3×3 stride-2 pad-1 im2col of `batch` `[gh, gw, c]` grids into `[batch·oh·ow, 9c]` rows (c, ky, kx).
    pub fn im2col_3x3s2(
        &self,
        input: &DeviceBuffer<bf16>,
        batch: usize,
        gh: usize,
        gw: usize,
        c: usize,
        out: &mut DeviceBuffer<bf16>,
    ) -> Result<()> {
        const OP: &str = "im2col_3x3s2";
        let (oh, ow) = ((gh.max(1) - 1) / 2 + 1, (gw.max(1) - 1) / 2 + 1);
        if [batch, gh, gw, c].contains(&0) {
            return Err(GpuError::shape(OP, "empty input"));
        }
        need_len(
            OP,
            "input",
            input,
            product(OP, "input", &[batch, gh, gw, c])?,
        )?;
        let n_out = product(OP, "out", &[batch, oh, ow, 9, c])?;
        need_len(OP, "out", out, n_out)?;
        // the kernel keeps an image's output position (< oh·ow) in an int
        to_i32(OP, "oh × ow", product(OP, "oh × ow", &[oh, ow])?)?;
        let (oa, ia) = (out.addr(), input.addr());
        let (bt, a, bb, cc) = (
            to_i32(OP, "batch", batch)?,
            to_i32(OP, "gh", gh)?,
            to_i32(OP, "gw", gw)?,
            to_i32(OP, "c", c)?,
        );
        self.launch(Kernel::Im2col3x3s2Bf16, grid_stride(n_out), |b| {
            b.arg(&oa).arg(&ia).arg(&bt).arg(&a).arg(&bb).arg(&cc);
        })
    }
}

/// Output rows of a 3×3 stride-2 pad-1 convolution over `g` rows: `(g − 1)/2 + 1`.
pub fn conv3x3s2_out(g: usize) -> usize {
    (g.max(1) - 1) / 2 + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The extent check every Mat-based launch rests on, on the host: sums and products that
    /// would wrap in a release build (offsets and strides near usize::MAX) are errors, as are
    /// the plain misfits; exact fits pass.
    #[test]
    fn mat_extent_check_never_wraps() {
        let ok = |m: Mat, len: usize| m.check_len("op", "x", "f32", len).is_ok();
        assert!(ok(Mat::dense(3, 4), 12));
        assert!(!ok(Mat::dense(3, 4), 11));
        assert!(ok(Mat::strided(3, 4, 10, 2), 2 + 2 * 10 + 4));
        assert!(!ok(Mat::strided(3, 4, 10, 2), 2 + 2 * 10 + 3));
        assert!(!ok(Mat::dense(0, 4), 100));
        assert!(!ok(Mat::strided(2, 4, 3, 0), 100), "ld < cols");
        // offset + cols wraps to 3
        assert!(!ok(Mat::strided(1, 4, 4, usize::MAX), 16));
        // (rows − 1)·ld wraps to 0: 3 rows of stride 2⁶³ (on 64-bit) would "need" 4 elements
        let half = 1usize << (usize::BITS - 1);
        assert!(!ok(Mat::strided(3, 4, half, 0), 16));
        assert!(
            !ok(Mat::strided(2, 4, half, 0), 16),
            "no wrap, just too large"
        );
        // (rows − 1)·ld + offset wraps
        assert!(!ok(Mat::strided(3, 4, half / 2, half), 16));
        assert!(!ok(Mat::strided(usize::MAX, 1, 1, 1), usize::MAX));
        // the kernels take the column count as an i32
        let wide = i32::MAX as usize + 1;
        assert!(!ok(Mat::dense(1, wide), wide));
        assert!(ok(Mat::dense(1, wide - 1), wide));
        let e = Mat::strided(3, 4, half, 0)
            .check_len("rms_norm", "x", "f32", 16)
            .unwrap_err()
            .to_string();
        assert!(e.contains("more than usize::MAX"), "{e}");
    }

    /// The element counts of the non-Mat launches: products that would wrap are errors.
    #[test]
    fn element_counts_never_wrap() {
        assert_eq!(product("op", "x", &[2, 3, 4]).ok(), Some(24));
        assert_eq!(product("op", "x", &[]).ok(), Some(1));
        assert!(product("op", "x", &[1 << 40, 1 << 30]).is_err());
        assert!(product("op", "x", &[usize::MAX, 2]).is_err());
        // im2col's 9·c·oh·ow·batch, a wrapping product of small-looking factors
        assert!(product("im2col_3x3s2", "out", &[1 << 21, 1 << 21, 1 << 21, 9, 1]).is_err());
        assert_eq!(to_i32("op", "h", 7).ok(), Some(7));
        assert!(to_i32("op", "h", i32::MAX as usize + 1).is_err());
    }

    fn cu(lens: &[i32]) -> Vec<i32> {
        let mut c = vec![0];
        for l in lens {
            c.push(c.last().copied().unwrap_or(0) + l);
        }
        c
    }

    /// The wave model picks the 128-row kernel where 192-row blocks leave the last wave mostly idle, and
    /// the 192-row kernel where both fill their waves (the H200 measurements it encodes).
    #[test]
    fn warp_specialised_default_follows_the_wave_model() {
        // glm5_next 72×72 b1: 432 blocks of 192 rows = 3.3 waves; 656 of 128 = 5.0 waves
        assert_eq!(ws_default(64, &cu(&[5184]), 16, 132), FlashVariant::Ws2);
        // glm5_next 96×128 b1 and 72×72 b8: many full waves either way
        assert_eq!(ws_default(64, &cu(&[12288]), 16, 132), FlashVariant::Ws3);
        assert_eq!(ws_default(64, &cu(&[5184; 8]), 16, 132), FlashVariant::Ws3);
        // head dims 72 and 96: 192-row blocks at every tower shape
        assert_eq!(ws_default(72, &cu(&[2394]), 16, 132), FlashVariant::Ws3);
        assert_eq!(ws_default(96, &cu(&[1296; 6]), 16, 132), FlashVariant::Ws3);
    }

    /// Shared memory per configuration, by hand from the layout kernels/flash_attn_sm90a.cu documents; every
    /// one under the 227 KB a block may opt into on compute capability 9.0.
    #[test]
    fn warp_specialised_shared_memory() {
        let c = WsConfig::new(96, FlashVariant::Ws3).map(|c| c.shared_bytes(96));
        // Q 2·192·128 + K, V 3·2·(2·96·128) + 13 barriers + 12 warps' scratch + slack
        assert_eq!(c, Some(49152 + 147456 + 104 + 96 + 1024));
        for hd in [64, 72, 96] {
            for v in [FlashVariant::Ws2, FlashVariant::Ws3] {
                let bytes = WsConfig::new(hd, v)
                    .map(|c| c.shared_bytes(hd))
                    .unwrap_or(usize::MAX);
                assert!(bytes <= 227 * 1024, "hd {hd} {v:?}: {bytes} bytes");
            }
        }
        assert!(WsConfig::new(80, FlashVariant::Ws3).is_none());
        assert!(WsConfig::new(64, FlashVariant::M2).is_none());
    }
}
