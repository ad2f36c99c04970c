//! Launchers of `kernels/flash_attn.cu` (mma.sync bf16 / f16, Turing's f16, f32 exact) and
//! `kernels/flash_attn_sm90a.cu` (warp-specialised wgmma + TMA): variable-length non-causal
//! attention, the variant choice.

use cudarc::driver::{LaunchConfig, PushKernelArg};
use half::bf16;

use super::act::{ActElem, AttnDtype};
use super::common::{need_len, off, product, Mat};
use crate::device::DeviceBuffer;
use crate::kernels::Kernel;
use crate::tier::F16Attention;
use crate::{Device, GpuError, Result};

/// Largest head dimension of the f32 attention kernel (`flash_attn_f32`).
pub const MAX_F32_ATTN_HEAD_DIM: usize = 128;
/// `flash_attn_f32`'s query rows per block (`ATT_BQ`) and shared K+V rows (`2·ATT_BK`).
const F32_ATTN_ROWS: usize = 32;
const F32_ATTN_KEYS: usize = 64;
/// Key rows of Turing's K and V tiles in shared memory: 32-key tiles (`SM75_BC`) in one buffer (2 × 32).
const SM75_KV_ROWS: usize = 2 * 32;

/// The m16n8k16 kernels' block shape, as `FLASH_ENTRY(HD, HDP, MT, BC, QS)` instantiates them in
/// kernels/flash_attn.cu: (query rows per block, key rows of the K and V tiles in shared memory, double
/// buffered: 2 × 2 × key tile). [`FlashVariant::M1`]: 64 rows, 64-key tiles. [`FlashVariant::M2`]: 128
/// rows; FlashAttention-2's 128-key tile at head dim 64, 64-key tiles at 72 and 96 (the fastest of
/// `kernels/dev/fa_mma_bench.cu`'s block shapes per head dim, docs/PERF.md v0.20).
fn mma_shape(head_dim: usize, variant: FlashVariant) -> (usize, usize) {
    match (variant, head_dim) {
        (FlashVariant::M1, _) => (64, 4 * 64),
        (_, 64) => (128, 4 * 128),
        _ => (128, 4 * 64),
    }
}

/// The default m16n8k16 variant where no warp-specialised kernel runs (the 8.0 tier's bf16, f16 from 8.0
/// on): 128-row blocks at head dims 64 and 96 at every tower shape (measured down to 352 blocks: step3p7's
/// 2 704 tokens at batch 1, 20 % faster than 64-row blocks there); at head dim 72, 64-row blocks until the
/// 128-row grid fills the SMs several times over (`many`: ≥ ~1000 blocks; gemma4 at batch 1 is 3 % faster
/// in 64-row blocks, at batch 8 14 % slower).
fn mma_default(head_dim: usize, many: bool) -> FlashVariant {
    if head_dim == 72 && !many {
        FlashVariant::M1
    } else {
        FlashVariant::M2
    }
}

/// Flash-attention variant (bf16, f16). `M*`: mma.sync m16n8k16 kernels (any sm_80+ device), 16-row
/// m-tiles per warp, 4 warps per block. `Ws*`: the sm_90a warp-specialised kernels (bf16, compute
/// capability 9.0 only): a producer warpgroup streams K and V tiles with the tensor copy engine into a
/// 3-stage ring, consumer warpgroups of 64 query rows run wgmma and the softmax
/// (kernels/flash_attn_sm90a.cu). `Sm75`: Turing's f16 kernel (any sm_75+ device).
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
    /// f16 only: mma.sync m16n8k8 with plain loads (the Turing tier's kernel), 1 m-tile per warp: 64
    /// query rows per block, 32-key tiles.
    Sm75,
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
    /// V `[ST][NA][BN][128 B]`, 1 + 4·ST mbarriers, 4 bytes per lane of every consumer warp (the scheduling
    /// fence's slots), 1024 bytes of alignment slack.
    fn shared_bytes(self, head_dim: usize) -> usize {
        let atoms = head_dim.next_multiple_of(16).div_ceil(64);
        let q = atoms * self.rows() * 128;
        let tile = atoms * self.key_tile * 128;
        q + 2 * self.stages * tile + 8 * (1 + 4 * self.stages) + 128 * 4 * self.consumers + 1024
    }
}

fn no_bf16_attention(head_dim: usize) -> GpuError {
    GpuError::shape(
        "flash_attn",
        format!("head_dim {head_dim} (bf16 kernels exist for 64, 72, 96)"),
    )
}

fn no_f16_attention(head_dim: usize) -> GpuError {
    GpuError::shape(
        "flash_attn",
        format!("head_dim {head_dim} (f16 kernels exist for 64, 72, 96)"),
    )
}

/// The f16 kernel of `variant` at `head_dim` and its query rows per block; `tier` is the device's f16
/// attention ([`crate::tier::KernelSet::f16_attention`]): the m16n8k16 kernels need compute capability
/// 8.0 (their compute_75 build traps), the warp-specialised ones are bf16 alone.
fn f16_kernel(
    head_dim: usize,
    variant: FlashVariant,
    tier: F16Attention,
) -> Result<(Kernel, usize, usize)> {
    let m16 = |k1, k2| {
        let (rows, kv_rows) = mma_shape(head_dim, variant);
        (
            if variant == FlashVariant::M1 { k1 } else { k2 },
            rows,
            kv_rows,
        )
    };
    match variant {
        FlashVariant::M1 | FlashVariant::M2 if tier == F16Attention::Sm75 => Err(GpuError::shape(
            "flash_attn",
            format!(
                "f16 {variant:?} (mma.sync m16n8k16, cp.async) needs compute capability 8.0; this tier \
                 runs FlashVariant::Sm75"
            ),
        )),
        FlashVariant::M1 | FlashVariant::M2 => Ok(match head_dim {
            64 => m16(Kernel::FlashAttnHd64M1F16, Kernel::FlashAttnHd64M2F16),
            72 => m16(Kernel::FlashAttnHd72M1F16, Kernel::FlashAttnHd72M2F16),
            96 => m16(Kernel::FlashAttnHd96M1F16, Kernel::FlashAttnHd96M2F16),
            hd => return Err(no_f16_attention(hd)),
        }),
        FlashVariant::Sm75 => {
            let k = match head_dim {
                64 => Kernel::FlashAttnSm75Hd64M1F16,
                72 => Kernel::FlashAttnSm75Hd72M1F16,
                96 => Kernel::FlashAttnSm75Hd96M1F16,
                hd => return Err(no_f16_attention(hd)),
            };
            Ok((k, 64, SM75_KV_ROWS))
        }
        FlashVariant::Ws2 | FlashVariant::Ws3 => Err(GpuError::shape(
            "flash_attn",
            format!("{variant:?}: the warp-specialised kernels are bf16 only"),
        )),
    }
}

/// Head-dim-64 throughput of the two warp-specialised kernels when the grid fills many waves (TFLOP/s on the
/// H200, the repository's `kernels/dev/fa_ws_bench.cu`, n = 12288): the wave model in [`ws_default`] weighs them.
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

/// Arguments of [`Device::flash_attn`]: `o = softmax(scale·q·kᵀ)·v` per head and segment, in bf16 or
/// f16 (tensor cores) or f32 (exact, CUDA cores).
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
    /// Head dimension: bf16 and f16 64, 72 or 96; f32 any in 1..=[`MAX_F32_ATTN_HEAD_DIM`].
    pub head_dim: usize,
    /// Segment boundaries `[segments + 1]` on the device.
    pub cu_seqlens: &'a DeviceBuffer<i32>,
    /// The same boundaries on the host (shape checks and the grid).
    pub cu_seqlens_host: &'a [i32],
    /// Softmax scale (gemma4 1.0; others hd^−½).
    pub scale: f32,
    /// bf16 / f16 kernel variant; `None` = the default for the tier and the head dim. Must be `None`
    /// for f32 (one kernel).
    pub variant: Option<FlashVariant>,
}

impl Device {
    /// Non-causal variable-length flash attention; writes `o [tokens, heads·head_dim]` (`om`) in the
    /// inputs' type. bf16: tensor-core kernels for head dims 64, 72, 96 (ld and offsets multiples of 8),
    /// compute capability 8.0 and newer. f16: the same head dims and layout on every tier: the
    /// m16n8k16 kernels ([`FlashVariant::M1`], [`FlashVariant::M2`]) from 8.0, Turing's
    /// ([`FlashVariant::Sm75`], the default on tier 7.5) anywhere. f32: one exact CUDA-core kernel (f32
    /// scores, online softmax and P·V), any head dim up to [`MAX_F32_ATTN_HEAD_DIM`], any strides.
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
        let segments = cu.len() - 1;
        // mma.sync variants at head dim 72: 128-row blocks (M2) once the grid fills the SMs several times over
        let many = max_len.div_ceil(128) * a.heads * segments >= 1000;
        let (kernel, align, br, threads, smem) = match T::ATTN {
            AttnDtype::F32 => {
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
                    Kernel::FlashAttnF32,
                    1,
                    F32_ATTN_ROWS,
                    128,
                    (F32_ATTN_ROWS + F32_ATTN_KEYS) * (a.head_dim + 1) * 4,
                )
            }
            AttnDtype::F16 => {
                if !self.supports_f16() {
                    return Err(GpuError::shape(
                        OP,
                        format!("this device's tier {} has no f16 kernels", self.tier()),
                    ));
                }
                let tier = self.tier().arch.kernels.f16_attention();
                let variant = match a.variant {
                    Some(v) => v,
                    None if tier == F16Attention::Sm75 => FlashVariant::Sm75,
                    None => mma_default(a.head_dim, many),
                };
                let (kernel, br, kv_rows) = f16_kernel(a.head_dim, variant, tier)?;
                // Q [br] + K, V rows of hdp + 8 f16 (kernels/flash_attn.cu)
                let hdp = a.head_dim.next_multiple_of(16);
                (kernel, 8, br, 128, (br + kv_rows) * (hdp + 8) * 2)
            }
            AttnDtype::Bf16 => {
                if !self.supports_bf16() {
                    return Err(GpuError::shape(
                        OP,
                        format!(
                            "bf16 attention needs bf16 tensor cores (compute capability 8.0+); this \
                             device runs tier {}",
                            self.tier()
                        ),
                    ));
                }
                let ws = self.has_kernel(Kernel::FlashAttnWsHd64C3Bf16);
                // Measured on the H200 (docs/notes/flash-attn-sm90a.md): the warp-specialised kernels are the
                // fastest at every tower shape (336–537 TFLOP/s, 1.17–1.72× cuDNN); without sm_90a, the
                // mma.sync blocks `mma_default` picks.
                let variant = match a.variant {
                    Some(v) => v,
                    None if ws => ws_default(a.head_dim, cu, a.heads, self.multiprocessors()?),
                    None => mma_default(a.head_dim, many),
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
                        let (br, kv_rows) = mma_shape(a.head_dim, variant);
                        // Q [br] + K, V [2 × key tile] rows of hdp + 8 bf16 (kernels/flash_attn.cu)
                        (kernel, br, 128, (br + kv_rows) * (hdp + 8) * 2)
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
                    FlashVariant::Sm75 => {
                        return Err(GpuError::shape(
                            OP,
                            "FlashVariant::Sm75 is Turing's f16 kernel: bf16 has none",
                        ))
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
        let exact = T::ATTN == AttnDtype::F32;
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
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// The m16n8k16 block shapes and defaults of kernels/flash_attn.cu's entry table: 128 × 128 tiles at
    /// head dim 64 within the 99 KB of 8.6 / 8.9 / 12.x; 128-row blocks at 64 and 96 at every shape, at 72
    /// only when the grid is large.
    #[test]
    fn mma_block_shapes_and_defaults() {
        assert_eq!(mma_shape(64, FlashVariant::M2), (128, 512));
        assert_eq!(mma_shape(96, FlashVariant::M2), (128, 256));
        assert_eq!(mma_shape(72, FlashVariant::M1), (64, 256));
        for hd in [64, 72, 96] {
            for v in [FlashVariant::M1, FlashVariant::M2] {
                let (rows, kv) = mma_shape(hd, v);
                let bytes = (rows + kv) * (hd.next_multiple_of(16) + 8) * 2;
                assert!(bytes <= 99 * 1024, "hd {hd} {v:?}: {bytes}");
            }
        }
        assert_eq!(mma_default(64, false), FlashVariant::M2);
        assert_eq!(mma_default(96, false), FlashVariant::M2);
        assert_eq!(mma_default(72, false), FlashVariant::M1);
        assert_eq!(mma_default(72, true), FlashVariant::M2);
    }

    /// `mma_shape` is the launcher's copy of kernels/flash_attn.cu's `FLASH_ENTRY(HD, HDP, MT, BC, QS)` table:
    /// the shared memory a launch asks for follows from it, so the two must agree line by line.
    #[test]
    fn mma_shape_is_the_entry_table_of_flash_attn_cu() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels/flash_attn.cu");
        let src = std::fs::read_to_string(&path).unwrap();
        let entries: Vec<Vec<usize>> = src
            .lines()
            .filter_map(|l| l.strip_prefix("FLASH_ENTRY("))
            .map(|l| {
                l.trim_end_matches(')')
                    .split(',')
                    .map(|f| match f.trim() {
                        "true" => 1,
                        "false" => 0,
                        n => n.parse().unwrap(),
                    })
                    .collect()
            })
            .collect();
        assert_eq!(entries.len(), 6, "{entries:?}");
        for e in &entries {
            let (hd, mt, key_tile) = (e[0], e[2], e[3]);
            let v = if mt == 1 {
                FlashVariant::M1
            } else {
                FlashVariant::M2
            };
            assert_eq!(mma_shape(hd, v), (64 * mt, 4 * key_tile), "entry {e:?}");
        }
    }

    /// The f16 kernels per tier: Turing's everywhere, the m16n8k16 ones from 8.0 only, no warp-specialised
    /// f16; Turing's shared memory (Q 64 rows + one 32-key K and V tile, pitch hdp + 8) within the
    /// 64 KB of tier 7.5, the m16n8k16 ones within the 99 KB of 8.6 / 8.9 / 12.x.
    #[test]
    fn f16_kernels_per_tier() {
        use F16Attention::{M16n8k16, Sm75};
        let smem = |hd: usize, v, t| {
            f16_kernel(hd, v, t).map(|(_, br, kv)| (br + kv) * (hd.next_multiple_of(16) + 8) * 2)
        };
        for hd in [64, 72, 96] {
            for tier in [Sm75, M16n8k16] {
                let bytes = smem(hd, FlashVariant::Sm75, tier).unwrap_or(usize::MAX);
                assert!(bytes <= 27 * 1024, "hd {hd}: {bytes}");
                assert!(f16_kernel(hd, FlashVariant::Ws3, tier).is_err());
            }
            assert!(f16_kernel(hd, FlashVariant::M1, Sm75).is_err());
            assert!(f16_kernel(hd, FlashVariant::M2, Sm75).is_err());
            let m2 = smem(hd, FlashVariant::M2, M16n8k16).unwrap_or(usize::MAX);
            assert!(m2 <= 99 * 1024, "hd {hd}: {m2}");
        }
        assert_eq!(smem(96, FlashVariant::Sm75, Sm75).ok(), Some(128 * 104 * 2));
        assert_eq!(
            smem(72, FlashVariant::M1, M16n8k16).ok(),
            Some(320 * 88 * 2)
        );
        assert_eq!(
            f16_kernel(72, FlashVariant::Sm75, Sm75).map(|k| k.0).ok(),
            Some(Kernel::FlashAttnSm75Hd72M1F16)
        );
        assert_eq!(
            f16_kernel(64, FlashVariant::M2, M16n8k16).map(|k| k.0).ok(),
            Some(Kernel::FlashAttnHd64M2F16)
        );
        assert!(f16_kernel(80, FlashVariant::Sm75, Sm75).is_err());
    }

    /// Shared memory per configuration, by hand from the layout kernels/flash_attn_sm90a.cu documents; every
    /// one under the 227 KB a block may opt into on compute capability 9.0.
    #[test]
    fn warp_specialised_shared_memory() {
        let c = WsConfig::new(96, FlashVariant::Ws3).map(|c| c.shared_bytes(96));
        // Q 2·192·128 + K, V 3·2·(2·96·128) + 13 barriers + 12 warps' scratch (a slot per lane) + slack
        assert_eq!(c, Some(49152 + 147456 + 104 + 12 * 128 + 1024));
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
