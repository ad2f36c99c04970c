//! Launcher of `kernels/gemm_sm90a.cu`: the bf16 GEMM with the activation (or the gate of an MLP's
//! gate|up projection) in its epilogue, `y = act(x·Wᵀ + b)` with one bf16 rounding, on compute
//! capability 9.0; [`InterleavedGateUp`] and [`interleave_gate_up`] arrange a gate|up weight the way the
//! gated kernel reads it.
//!
//! Why: cuBLASLt has no quick_gelu, SwiGLU or GEGLU epilogue, so an MLP otherwise writes the GEMM output,
//! reads it back and writes it again in [`Device::act`] / [`Device::gated_act`]. Where the kernel is not
//! loaded (any device but compute capability 9.0), a tower keeps that two-step path
//! ([`Device::fused_gemm_supports`] says which).

use cudarc::driver::{LaunchConfig, PushKernelArg};
use half::bf16;

use super::act::Gate;
use super::common::Clamp;
use super::common::{all_aligned, off, to_i32, Mat};
use crate::device::DeviceBuffer;
use crate::gemm::GemmBias;
use crate::kernels::Kernel;
use crate::upload::HostSource;
use crate::Activation;
use crate::{Device, GpuError, Result};

/// Rows per gate or up run of an interleaved gate|up weight: rows `16g .. 16g + 7` are gates
/// `8g .. 8g + 7`, rows `16g + 8 .. 16g + 15` their ups (the kernel's accumulator fragments hold 8
/// consecutive columns, so a thread holds a gate and its up side by side).
pub const GATE_UP_GROUP: usize = 8;

/// Output tile of the kernel: 128 rows × 256 columns of W (`BM`, `BN` in kernels/gemm_sm90a.cu).
const TILE_ROWS: usize = 128;
const TILE_COLS: usize = 256;
/// One producer and two consumer warpgroups.
const THREADS: u32 = 384;
/// Dynamic shared memory, as `gemm_ws::ActCfg<GATED>::BYTES` computes it: the ring of 48 KB stages (x's
/// 128 rows and W's 256 rows of one 64-column k-block), the two consumer warpgroups' staging areas
/// (64 rows × 256 bf16 plain, × 128 gated), 16 bytes of barriers per stage, 1024 bytes of alignment slack.
const fn shared_bytes(gated: bool) -> usize {
    let stages = if gated { 4 } else { 3 };
    let staging = if gated { 2 * 2 * 8192 } else { 2 * 4 * 8192 };
    stages * 48 * 1024 + staging + 16 * stages + 1024
}

/// What the fused GEMM applies to each output before its one rounding.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FusedAct {
    /// `y = clamp_output(act(clamp_input(x·Wᵀ + b)))`, as [`Device::act`] on the GEMM's output.
    Plain {
        /// The activation.
        act: Activation,
        /// Clamp before the activation.
        input: Clamp,
        /// Clamp after it.
        output: Clamp,
    },
    /// [`Gate`] over W's gate|up rows in the [`interleave_gate_up`] order, as [`Device::gated_act`] on
    /// the gate and up halves of the GEMM's output; `y` has half as many columns as W has rows.
    Gated(Gate),
}

impl FusedAct {
    fn act(&self) -> Activation {
        match self {
            FusedAct::Plain { act, .. } => *act,
            FusedAct::Gated(g) => g.act,
        }
    }
    fn gated(&self) -> bool {
        matches!(self, FusedAct::Gated(_))
    }
}

/// The kernel that computes `act` (one per activation and kind in kernels/gemm_sm90a.cu: the towers' three
/// activations; the others have none).
fn fused_kernel(act: &FusedAct) -> Option<Kernel> {
    use Activation::*;
    Some(match (act.act(), act.gated()) {
        (GeluTanh, false) => Kernel::GemmActGeluTanhSm90a,
        (QuickGelu, false) => Kernel::GemmActQuickGeluSm90a,
        (Silu, false) => Kernel::GemmActSiluSm90a,
        (GeluTanh, true) => Kernel::GemmGateGeluTanhSm90a,
        (QuickGelu, true) => Kernel::GemmGateQuickGeluSm90a,
        (Silu, true) => Kernel::GemmGateSiluSm90a,
        (GeluErf | Identity, _) => return None,
    })
}

impl Device {
    /// Whether [`Device::gemm_act`] runs here for `act` on a weight of `n` rows and `k` columns: the
    /// kernel is loaded (compute capability 9.0), it computes `act`, `k` and `n` are multiples of 8
    /// (gated: `n` of 16, whole gate|up groups) and the shared memory it needs is available.
    pub fn fused_gemm_supports(&self, act: &FusedAct, n: usize, k: usize) -> bool {
        let n_unit = if act.gated() { 2 * GATE_UP_GROUP } else { 8 };
        fused_kernel(act).is_some_and(|kn| self.has_kernel(kn))
            && k > 0
            && n > 0
            && k.is_multiple_of(8)
            && n.is_multiple_of(n_unit)
            && self.smem_optin >= shared_bytes(act.gated())
    }

    /// `y = act(x·Wᵀ + bias)` in one kernel (see [`FusedAct`]): bf16 `x [rows, k]` (`xm`), dense bf16
    /// `W [n, k]` (gated: rows interleaved by [`interleave_gate_up`], bias likewise), bf16 `y` (`ym`:
    /// `rows × n`, gated `rows × n/2`); f32 accumulation, the bias added in f32, one rounding. Every
    /// row start of `x` and `y` must be 16-byte aligned (strides and offsets multiples of 8 elements).
    /// An error where [`Device::fused_gemm_supports`] is false.
    pub fn gemm_act(
        &self,
        x: &DeviceBuffer<bf16>,
        xm: Mat,
        w: &DeviceBuffer<bf16>,
        n: usize,
        bias: Option<GemmBias<'_>>,
        y: &mut DeviceBuffer<bf16>,
        ym: Mat,
        act: FusedAct,
    ) -> Result<()> {
        const OP: &str = "gemm_act";
        let (m, k) = (xm.rows, xm.cols);
        let kernel = fused_kernel(&act).filter(|_| self.fused_gemm_supports(&act, n, k));
        let Some(kernel) = kernel else {
            return Err(GpuError::shape(
                OP,
                format!(
                    "no fused kernel for {:?} with W {n}×{k} on this device (needs compute capability 9.0, \
                     GELU-tanh, quick_gelu or SiLU, k ≡ 0 mod 8, n ≡ 0 mod {})",
                    act.act(),
                    if act.gated() { 16 } else { 8 }
                ),
            ));
        };
        let cols = if act.gated() { n / 2 } else { n };
        if ym.rows != m || ym.cols != cols {
            return Err(GpuError::shape(
                OP,
                format!("y is {}×{}, the product is {m}×{cols}", ym.rows, ym.cols),
            ));
        }
        xm.check(OP, "x", x)?;
        ym.check(OP, "y", y)?;
        Mat::dense(n, k).check(OP, "W", w)?;
        let (bias_addr, bias_bf16) = match bias {
            None => (0u64, 0i32),
            Some(GemmBias::F32(b)) => {
                Mat::dense(1, n).check(OP, "bias", b)?;
                (b.addr(), 0)
            }
            Some(GemmBias::Bf16(b)) => {
                Mat::dense(1, n).check(OP, "bias", b)?;
                (b.addr(), 1)
            }
            Some(GemmBias::F16(_)) => {
                return Err(GpuError::shape(
                    OP,
                    "the fused kernel is bf16: its bias is f32 or bf16, not f16",
                ))
            }
        };
        let (xa, wa, ya) = (off(x, xm.offset), w.addr(), off(y, ym.offset));
        // the tensor maps' global addresses and row strides must be multiples of 16 bytes
        if !all_aligned(&[xa, wa, ya], 16) || !xm.ld.is_multiple_of(8) || !ym.ld.is_multiple_of(8) {
            return Err(GpuError::shape(
                OP,
                format!(
                    "x, W and y rows must start on 16-byte boundaries (x stride {}, y stride {})",
                    xm.ld, ym.ld
                ),
            ));
        }
        let (mi, ni, ki) = (
            to_i32(OP, "rows", m)?,
            to_i32(OP, "n", n)?,
            to_i32(OP, "k", k)?,
        );
        let tiles = m.div_ceil(TILE_ROWS) * n.div_ceil(TILE_COLS);
        to_i32(OP, "tiles", tiles)?;
        let mx = crate::tma::rows_bf16(xa, k, m, xm.ld, 64, TILE_ROWS as u32)?;
        let mw = crate::tma::rows_bf16(wa, k, n, k, 64, TILE_COLS as u32)?;
        let my = crate::tma::rows_bf16(ya, cols, m, ym.ld, 64, 64)?;
        let cfg = LaunchConfig {
            grid_dim: (tiles.min(self.sms) as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: shared_bytes(act.gated()) as u32,
        };
        match act {
            FusedAct::Plain { input, output, .. } => self.launch(kernel, cfg, |b| {
                b.arg(&mx)
                    .arg(&mw)
                    .arg(&my)
                    .arg(&bias_addr)
                    .arg(&bias_bf16)
                    .arg(&mi)
                    .arg(&ni)
                    .arg(&ki)
                    .arg(&input.lo)
                    .arg(&input.hi)
                    .arg(&output.lo)
                    .arg(&output.hi);
            }),
            FusedAct::Gated(g) => self.launch(kernel, cfg, |b| {
                b.arg(&mx)
                    .arg(&mw)
                    .arg(&my)
                    .arg(&bias_addr)
                    .arg(&bias_bf16)
                    .arg(&mi)
                    .arg(&ni)
                    .arg(&ki)
                    .arg(&g.gate_limit)
                    .arg(&g.gate.lo)
                    .arg(&g.gate.hi)
                    .arg(&g.up.lo)
                    .arg(&g.up.hi)
                    .arg(&g.out.lo)
                    .arg(&g.out.hi);
            }),
        }
    }
}

/// Row `r` of the interleaved order ↦ row of the stacked `[gate; up]` (`half` rows each).
fn stacked_row(r: usize, half: usize) -> usize {
    let (g, o) = (r / (2 * GATE_UP_GROUP), r % (2 * GATE_UP_GROUP));
    if o < GATE_UP_GROUP {
        g * GATE_UP_GROUP + o
    } else {
        half + g * GATE_UP_GROUP + (o - GATE_UP_GROUP)
    }
}

/// The rows of a stacked `[gate; up]` matrix (`2·half` rows of `cols`) in the gated kernel's order
/// (see [`GATE_UP_GROUP`]); a bias is the `cols = 1` case. `half` must be a multiple of
/// [`GATE_UP_GROUP`] and `stacked` hold `2·half·cols` values.
pub fn interleave_gate_up<T: Copy>(stacked: &[T], half: usize, cols: usize) -> Result<Vec<T>> {
    check_interleave(stacked.len(), half, cols)?;
    Ok((0..2 * half)
        .flat_map(|r| {
            let s = stacked_row(r, half) * cols;
            stacked[s..s + cols].iter().copied()
        })
        .collect())
}

fn check_interleave(len: usize, half: usize, cols: usize) -> Result<()> {
    if half == 0 || !half.is_multiple_of(GATE_UP_GROUP) || Some(len) != half.checked_mul(2 * cols) {
        return Err(GpuError::shape(
            "interleave_gate_up",
            format!(
                "{len} values are not 2 × {half} rows of {cols} with {half} a positive multiple of {GATE_UP_GROUP}"
            ),
        ));
    }
    Ok(())
}

/// A stacked `[gate; up]` weight (`2·half` rows of `cols`, e.g. a file's two tensors as one
/// [`crate::HostTensor::Stack`]) read in the [`interleave_gate_up`] order, so the [`crate::Stager`]
/// uploads it from the file without a rearranged host copy.
pub struct InterleavedGateUp<'a> {
    src: &'a dyn HostSource,
    half: usize,
    cols: usize,
}

impl<'a> InterleavedGateUp<'a> {
    /// The view; an error unless `src` holds `2·half·cols` values with `half` a positive multiple of
    /// [`GATE_UP_GROUP`].
    pub fn new(src: &'a dyn HostSource, half: usize, cols: usize) -> Result<Self> {
        check_interleave(src.len(), half, cols)?;
        Ok(InterleavedGateUp { src, half, cols })
    }

    /// Calls `f(source start, destination range)` for each run of consecutive source values behind
    /// elements `start .. start + len` (at most one row of `cols` each).
    fn runs(&self, start: usize, len: usize, mut f: impl FnMut(usize, std::ops::Range<usize>)) {
        let mut i = 0;
        while i < len {
            let e = start + i;
            let (r, c) = (e / self.cols, e % self.cols);
            let take = (self.cols - c).min(len - i);
            f(stacked_row(r, self.half) * self.cols + c, i..i + take);
            i += take;
        }
    }
}

impl HostSource for InterleavedGateUp<'_> {
    fn len(&self) -> usize {
        2 * self.half * self.cols
    }
    fn read_f32(&self, start: usize, out: &mut [f32]) {
        self.runs(start, out.len(), |s, d| {
            let len = d.len();
            self.src.read_f32(s, &mut out[d.start..d.start + len])
        });
    }
    fn read_bf16(&self, start: usize, out: &mut [bf16]) {
        self.runs(start, out.len(), |s, d| {
            let len = d.len();
            self.src.read_bf16(s, &mut out[d.start..d.start + len])
        });
    }
    fn read_f16(&self, start: usize, out: &mut [half::f16]) {
        self.runs(start, out.len(), |s, d| {
            let len = d.len();
            self.src.read_f16(s, &mut out[d.start..d.start + len])
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaving_puts_each_gate_beside_its_up() {
        // 2 × 16 rows of 3 columns: value = stacked row · 10 + column
        let (half, cols) = (16usize, 3usize);
        let stacked: Vec<f32> = (0..2 * half * cols)
            .map(|i| ((i / cols) * 10 + i % cols) as f32)
            .collect();
        let got = interleave_gate_up(&stacked, half, cols).unwrap();
        let row = |r: usize| got[r * cols] / 10.0;
        // group 0: gates 0..7, ups 16..23; group 1: gates 8..15, ups 24..31
        let want: Vec<f32> = (0..8)
            .chain(16..24)
            .chain(8..16)
            .chain(24..32)
            .map(|r| r as f32)
            .collect();
        assert_eq!((0..2 * half).map(row).collect::<Vec<_>>(), want);
        assert_eq!(got[5 * cols + 2], 52.0, "columns stay in place");
        // the streaming view reads the same values from any start, across row boundaries
        let view = InterleavedGateUp::new(&stacked, half, cols).unwrap();
        assert_eq!(view.len(), got.len());
        for start in [0, 1, 2, 3, 7, 47, 90] {
            for len in [0, 1, 4, 50, got.len() - start] {
                let len = len.min(got.len() - start);
                let mut f = vec![f32::NAN; len];
                view.read_f32(start, &mut f);
                assert_eq!(f, got[start..start + len], "f32 {start}+{len}");
                let mut b = vec![bf16::NAN; len];
                view.read_bf16(start, &mut b);
                let want: Vec<bf16> = got[start..start + len]
                    .iter()
                    .map(|v| bf16::from_f32(*v))
                    .collect();
                assert_eq!(b, want, "bf16 {start}+{len}");
            }
        }
    }

    #[test]
    fn interleaving_rejects_partial_groups_and_wrong_lengths() {
        let v = vec![0.0f32; 2 * 12 * 4];
        assert!(
            interleave_gate_up(&v, 12, 4).is_err(),
            "12 is not a multiple of 8"
        );
        assert!(interleave_gate_up(&v, 8, 4).is_err(), "length 96 ≠ 64");
        assert!(interleave_gate_up(&v[..64], 8, 4).is_ok());
        assert!(InterleavedGateUp::new(&v, 0, 4).is_err());
        assert!(
            interleave_gate_up::<f32>(&[], 8, 0).is_ok(),
            "no columns: nothing to move"
        );
    }

    #[test]
    fn shared_memory_matches_the_kernel_layout() {
        // CoopSmem<3, 64 KB>::BYTES and CoopSmem<4, 32 KB>::BYTES; both within the 227 KB opt-in limit
        assert_eq!(shared_bytes(false), 3 * 49152 + 65536 + 48 + 1024);
        assert_eq!(shared_bytes(true), 4 * 49152 + 32768 + 64 + 1024);
        assert!(shared_bytes(true) <= 227 * 1024 && shared_bytes(false) <= 227 * 1024);
    }
}
