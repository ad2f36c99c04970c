//! The Gemma-4 tower on a CUDA device: the same op sequence as [`crate::forward_host`], on
//! gpu-core's kernels and cuBLASLt GEMMs, for many images of different sizes in one padding-free
//! pass (one attention segment per image).
//!
//! **Architecture Invariant:** nothing is copied to the host inside [`DeviceTower::run`]; only the
//! stages (when asked) and the final rows ([`DeviceTower::rows`]) come back.
//!
//! Layout on the device:
//! - linear weights in bf16 ([`Precision::Bf16`], the product mode), f16 ([`Precision::F16`]:
//!   bf16's path in IEEE half, for tiers without bf16; its rows are checked finite, see the
//!   `f16 range` notes in `forward.rs` for the clamps) or f32
//!   ([`Precision::F32`], the exactness mode: f32 GEMMs); norms, tables, clamps, the
//!   standardisation and the residual stream in f32;
//! - q/k/v fused into one `[3·nh·kd, H]` weight when their input clamps agree (else one GEMM per
//!   linear, each on its own clamped pre-norm), gate/up likewise into `[2I, H]`; a fused gate|up is
//!   an [`ActLinear`] with the gate (one GEMM with the gate in its epilogue in bf16 on compute
//!   capability 9.0, rows interleaved at upload);
//! - the patch projection folds the input law `2(x − 0.5)`: `W·(2x − 1) = (2W)·x − W·1`, so the
//!   weight is doubled (exact) and `−rowsum(W)` (f64, rounded once) is the GEMM's f32 bias;
//! - bf16 and f16 modes: head dims the tensor-core attention kernels lack (they exist for 64, 72, 96) are
//!   zero-padded to the next one: zero q/k/v weight rows and zero o columns, so the padded lanes
//!   contribute exact zeros (f32 mode: gpu-core's f32 attention takes any head dim up to 128).
//!
//! Between GEMMs every activation buffer (qkv, attention output, gate|up, gated activation) is in
//! the GEMM precision: bf16 (or f16) in the product mode, f32 in the exactness mode, where per-head
//! norm + rope, attention (`flash_attn_f32`, exact on CUDA cores) and the gated activation run
//! in f32 too, so nothing on the f32 path rounds to bf16.
use std::borrow::Cow;
use std::sync::Arc;

use gpu_core::{
    all_finite, pad_head_cols, pad_head_rows, rope_inv_freq, ActLinear, Activation, Batch, Clamp,
    DeviceBuffer, DeviceTower, Epilogue, FusedAct, Gate, GemmBias, GemmBuffer, GemmInputs,
    GemmOutput, GemmShape, GraphKey, HostBatch, HostGemm, HostInputs, HostTensor, InputBuffers,
    Mat, PassWorkspace, QkNorm, RopeLayout, RowsTarget, Stager, TensorStore, TowerBase,
};

use crate::config::GemmaConfig;
use crate::error::GemmaError;
use crate::forward::{non_finite, validate_grid, GemmaImage, GemmaStages, Grid, ATTENTION_SCALE};
use crate::weights::{GemmaWeights, Linear};

mod forward;

/// The device type, its error and the precision of the GEMMs, re-exported for callers of this path.
pub use gpu_core::{Device, GpuError, Precision};

/// Everything the CUDA path can fail with: gpu-core's one CUDA error over this family's
/// [`GemmaError`] (the weights or the input are wrong).
pub type CudaError = gpu_core::CudaError<GemmaError>;

/// Short for `Result<T, CudaError>`.
pub type CudaResult<T> = std::result::Result<T, CudaError>;

/// One GEMM writing a column block `[col, col + width)` of a wider output, on its own clamped input.
#[derive(Debug)]
struct Group {
    w: GemmBuffer,
    width: usize,
    col: usize,
    clamp_in: Clamp,
}

/// The MLP's gate|up projection and its gate.
#[derive(Debug)]
enum Mlp {
    /// gate and up share their input clamp: one layer on one clamped pre-norm (the fused kernel where
    /// the device has it).
    Joint { gate_up: ActLinear, clamp_in: Clamp },
    /// Different input clamps: one GEMM per linear into the gate|up buffer, then the gate.
    Split { groups: Vec<Group>, gate: Gate },
}

#[derive(Debug)]
struct DevLayer {
    ln_in: DeviceBuffer<f32>,
    ln_post_attn: DeviceBuffer<f32>,
    ln_pre_ffn: DeviceBuffer<f32>,
    ln_post_ffn: DeviceBuffer<f32>,
    qkv: Vec<Group>,
    qkv_out: [Clamp; 3],
    q_norm: DeviceBuffer<f32>,
    k_norm: DeviceBuffer<f32>,
    o: GemmBuffer,
    o_in: Clamp,
    o_out: Clamp,
    mlp: Mlp,
    down: GemmBuffer,
    down_out: Clamp,
}

/// The device buffers of a pass, sized for up to `cap` tokens and `cap_p` pooled rows (opaque:
/// kept in the tower's [`PassRunner`] between calls).
#[derive(Debug)]
pub struct Workspace {
    /// The fixed input buffers every forward reads (patch rows, positions, segments).
    inp: InputBuffers,
    cap: usize,
    cap_p: usize,
    x: DeviceBuffer<f32>,
    hn: GemmBuffer,
    qkv: GemmBuffer,
    attn: GemmBuffer,
    y: DeviceBuffer<f32>,
    /// gate|up output `[N, 2·I]` of the two-step MLPs (None where every layer's is fused).
    gu: Option<GemmBuffer>,
    act: GemmBuffer,
    pooled: DeviceBuffer<f32>,
    std: DeviceBuffer<f32>,
    normed: GemmBuffer,
    rows: DeviceBuffer<f32>,
}

impl PassWorkspace for Workspace {
    fn inputs_mut(&mut self) -> &mut InputBuffers {
        &mut self.inp
    }
    fn rows(&self) -> &DeviceBuffer<f32> {
        &self.rows
    }
}

/// What a Gemma-4 batch is, apart from its input values, its graph key and its rows: tokens,
/// segments and grids.
#[derive(Debug, Clone)]
pub struct GemmaMeta {
    n: usize,
    cu: Vec<i32>,
    /// `(gw, gh)` per image.
    grids: Vec<(usize, usize)>,
}

impl GemmaMeta {
    /// Patches (tokens) in the batch.
    pub fn tokens(&self) -> usize {
        self.n
    }
    /// Images in the batch.
    pub fn images(&self) -> usize {
        self.grids.len()
    }
}

/// A batch of validated images prepared on the host ([`DeviceTower::prepare_host`]), ready for
/// [`DeviceTower::stage`]; building one needs no device.
pub type GemmaHostBatch = HostBatch<GemmaMeta>;

/// A batch of validated images on the device: pixels, positions, attention segments and grids.
pub type GemmaBatch = Batch<GemmaMeta>;

/// The Gemma-4 tower's weights on a CUDA device, with a workspace kept between calls.
#[derive(Debug)]
pub struct GemmaCuda {
    patch_w: GemmBuffer,
    patch_b: DeviceBuffer<f32>,
    pos: DeviceBuffer<f32>,
    layers: Vec<DevLayer>,
    /// `diag(std_scale)` `[H, H]` and `−std_bias ⊙ std_scale` `[H]` (f32).
    std: Option<(DeviceBuffer<f32>, DeviceBuffer<f32>)>,
    proj: GemmBuffer,
    inv_freq: DeviceBuffer<f32>,
    /// f32 identity `[H, H]`: exact row-block copies (pooling images at an offset).
    eye_h: DeviceBuffer<f32>,
    /// Device, config, precision, kernel head dim, graphs and workspace.
    base: TowerBase<GemmaConfig, Workspace>,
}

/// q/k/v rows padded per head from `hd` to `kd` (zero rows); `None` when nothing is padded.
fn pad_rows<T: TensorStore>(l: &Linear<T>, heads: usize, hd: usize, kd: usize) -> Option<Vec<f32>> {
    (hd != kd).then(|| pad_head_rows(&l.w.to_f32_vec(), l.inp, heads, hd, kd))
}

/// o columns padded per head from `hd` to `kd` (zero columns); `None` when nothing is padded.
fn pad_cols<T: TensorStore>(l: &Linear<T>, heads: usize, hd: usize, kd: usize) -> Option<Vec<f32>> {
    (hd != kd).then(|| pad_head_cols(&l.w.to_f32_vec(), l.out, heads, hd, kd))
}

fn eye<T: Copy>(n: usize, one: T, zero: T) -> Vec<T> {
    let mut v = vec![zero; n * n];
    for i in 0..n {
        v[i * n + i] = one;
    }
    v
}

/// A linear's weight as uploaded: its padded f32 copy, or its store as it is.
fn weight<'t, T: TensorStore>(l: &'t Linear<T>, padded: &'t Option<Vec<f32>>) -> HostTensor<'t> {
    match padded {
        Some(v) => HostTensor::Slice(v),
        None => l.w.view(),
    }
}

/// One linear of a group: its store, its padded f32 copy if any, its output width.
type Part<'t, T> = (&'t Linear<T>, Option<Vec<f32>>, usize);

/// Groups of linears sharing one input clamp: fused into one weight (the parts stacked at
/// upload, nothing copied on the host) when all clamps agree.
fn groups<T: TensorStore>(
    st: &mut Stager,
    dev: &Device,
    p: Precision,
    parts: &[Part<'_, T>],
) -> CudaResult<Vec<Group>> {
    let same = parts.windows(2).all(|w| w[0].0.clamp_in == w[1].0.clamp_in);
    if same {
        let width: usize = parts.iter().map(|(_, _, r)| r).sum();
        let all = HostTensor::Stack(parts.iter().map(|(l, w, _)| weight(l, w)).collect());
        Ok(vec![Group {
            w: st.upload_gemm(dev, p, &all)?,
            width,
            col: 0,
            clamp_in: parts[0].0.clamp_in,
        }])
    } else {
        let mut col = 0;
        let mut v = Vec::new();
        for (l, w, r) in parts {
            v.push(Group {
                w: st.upload_gemm(dev, p, &weight(l, w))?,
                width: *r,
                col,
                clamp_in: l.clamp_in,
            });
            col += r;
        }
        Ok(v)
    }
}

impl GemmaCuda {
    /// Uploads `w` once (see the module docs for the layout). Tensors kept as the file has them
    /// go from their store (host f32, or the memory-mapped file's bytes) straight into
    /// page-locked staging in the GEMM precision, chunk by chunk; transformed ones (the folded
    /// patch projection, padded heads) are built in f32 one at a time.
    pub fn new<T: TensorStore>(
        dev: Arc<Device>,
        cfg: &GemmaConfig,
        w: &GemmaWeights<T>,
        precision: Precision,
    ) -> CudaResult<GemmaCuda> {
        let (h, heads, hd) = (cfg.hidden, cfg.heads, cfg.head_dim);
        let base = TowerBase::new(dev.clone(), cfg.clone(), precision, hd, cfg.text_hidden)?;
        let kd = base.kd;
        let wp = heads * kd;
        let p = precision;
        let d = &*dev;
        let mut st = Stager::new(d)?;
        // transformers Gemma4VisionPatchEmbedder: input_proj(2·(pixel − 0.5)) = (2W)·x − W·1.
        let pd = cfg.patch_dim();
        let patch = w.patch.to_f32_vec();
        let patch2: Vec<f32> = patch.iter().map(|v| 2.0 * v).collect();
        let bias: Vec<f32> = patch
            .chunks_exact(pd)
            .map(|r| -(r.iter().map(|&v| v as f64).sum::<f64>()) as f32)
            .collect();
        drop(patch);
        let mut layers = Vec::with_capacity(w.layers.len());
        for l in &w.layers {
            let qkv = groups(
                &mut st,
                d,
                p,
                &[
                    (&l.q, pad_rows(&l.q, heads, hd, kd), wp),
                    (&l.k, pad_rows(&l.k, heads, hd, kd), wp),
                    (&l.v, pad_rows(&l.v, heads, hd, kd), wp),
                ],
            )?;
            let mi = cfg.intermediate;
            let gate = Gate {
                act: cfg.activation,
                gate_limit: f32::INFINITY,
                gate: l.gate.clamp_out,
                up: l.up.clamp_out,
                out: l.down.clamp_in,
            };
            let mlp = if l.gate.clamp_in == l.up.clamp_in {
                let gu = HostTensor::Stack(vec![l.gate.w.view(), l.up.w.view()]);
                Mlp::Joint {
                    gate_up: ActLinear::upload(
                        &mut st,
                        d,
                        p,
                        &gu,
                        None,
                        2 * mi,
                        h,
                        FusedAct::Gated(gate),
                    )?,
                    clamp_in: l.gate.clamp_in,
                }
            } else {
                Mlp::Split {
                    groups: groups(&mut st, d, p, &[(&l.gate, None, mi), (&l.up, None, mi)])?,
                    gate,
                }
            };
            let o = pad_cols(&l.o, heads, hd, kd);
            let f32s = |st: &mut Stager, t: &T| -> CudaResult<DeviceBuffer<f32>> {
                Ok(st.upload::<f32>(d, t)?)
            };
            layers.push(DevLayer {
                ln_in: f32s(&mut st, &l.ln_in)?,
                ln_post_attn: f32s(&mut st, &l.ln_post_attn)?,
                ln_pre_ffn: f32s(&mut st, &l.ln_pre_ffn)?,
                ln_post_ffn: f32s(&mut st, &l.ln_post_ffn)?,
                qkv,
                qkv_out: [l.q.clamp_out, l.k.clamp_out, l.v.clamp_out],
                q_norm: f32s(&mut st, &l.q_norm)?,
                k_norm: f32s(&mut st, &l.k_norm)?,
                o: st.upload_gemm(d, p, &weight(&l.o, &o))?,
                o_in: l.o.clamp_in,
                o_out: l.o.clamp_out,
                mlp,
                down: st.upload_gemm(d, p, &l.down.w)?,
                down_out: l.down.clamp_out,
            });
        }
        let std = match &w.standardize {
            Some((b, s)) => {
                let (b, s) = (b.to_f32_vec(), s.to_f32_vec());
                let mut diag = vec![0.0f32; h * h];
                for i in 0..h {
                    diag[i * h + i] = s[i];
                }
                let nb: Vec<f32> = b
                    .iter()
                    .zip(&s)
                    .map(|(b, s)| -((*b as f64) * (*s as f64)) as f32)
                    .collect();
                Some((d.upload(&diag)?, d.upload(&nb)?))
            }
            None => None,
        };
        let t = GemmaCuda {
            patch_w: st.upload_gemm(d, p, &patch2)?,
            patch_b: d.upload(&bias)?,
            pos: st.upload::<f32>(d, &w.pos)?,
            layers,
            std,
            proj: st.upload_gemm(d, p, &w.proj)?,
            inv_freq: d.upload(&rope_inv_freq(hd, cfg.rope_theta))?,
            eye_h: d.upload(&eye(h, 1.0f32, 0.0))?,
            base,
        };
        dev.synchronize()?;
        drop(st);
        Ok(t)
    }

    /// Loads an HF checkpoint as views of the memory-mapped file and uploads it in
    /// `precision`: the model is never held in f32 on the host ([`crate::load_hf_mapped`]).
    pub fn from_checkpoint(
        dev: Arc<Device>,
        ck: &st_reader::Checkpoint,
        precision: Precision,
    ) -> CudaResult<GemmaCuda> {
        let (cfg, w) = crate::load_hf_mapped(ck)?;
        GemmaCuda::new(dev, &cfg, &w, precision)
    }

    /// Loads an mmproj GGUF as views of the memory-mapped file (a quantised tensor decoded on
    /// its own) and uploads it in `precision` ([`crate::load_gguf_mapped`]).
    pub fn from_gguf(
        dev: Arc<Device>,
        g: &gguf_reader::GgufFile,
        activation: crate::GgufActivation,
        precision: Precision,
    ) -> CudaResult<GemmaCuda> {
        let (cfg, w) = crate::load_gguf_mapped(g, activation)?;
        GemmaCuda::new(dev, &cfg, &w, precision)
    }

    fn ensure_workspace(&mut self, n: usize, np: usize) -> CudaResult<()> {
        if let Some(ws) = self.base.passes.workspace() {
            if ws.cap >= n && ws.cap_p >= np {
                return Ok(());
            }
        }
        let (cap, cap_p) = match self.base.passes.workspace() {
            Some(ws) => (ws.cap.max(n), ws.cap_p.max(np)),
            None => (n, np),
        };
        let c = &self.base.cfg;
        let (h, wp, mi) = (c.hidden, c.heads * self.base.kd, c.intermediate);
        let d = &*self.base.dev;
        let p = self.base.precision;
        self.base.passes.regrow(|| -> CudaResult<Workspace> {
            Ok(Workspace {
                inp: InputBuffers::alloc(d, p, cap * c.patch_dim(), 2 * cap, cap + 1)?,
                cap,
                cap_p,
                x: d.alloc(cap * h)?,
                hn: GemmBuffer::alloc(d, p, cap * h)?,
                qkv: GemmBuffer::alloc(d, p, cap * 3 * wp)?,
                attn: GemmBuffer::alloc(d, p, cap * wp)?,
                y: d.alloc(cap * h)?,
                gu: if self.layers.iter().all(|l| match &l.mlp {
                    Mlp::Joint { gate_up, .. } => gate_up.fused(),
                    Mlp::Split { .. } => false,
                }) {
                    None
                } else {
                    Some(GemmBuffer::alloc(d, p, cap * 2 * mi)?)
                },
                act: GemmBuffer::alloc(d, p, cap * mi)?,
                pooled: d.alloc(cap_p * h)?,
                std: d.alloc(cap_p * h)?,
                normed: GemmBuffer::alloc(d, p, cap_p * h)?,
                rows: d.alloc(cap_p * c.text_hidden)?,
            })
        })?;
        Ok(())
    }
}

impl DeviceTower for GemmaCuda {
    type Config = GemmaConfig;
    type Image<'a> = GemmaImage<'a>;
    type Meta = GemmaMeta;
    type Family = GemmaError;
    type Workspace = Workspace;
    type EncoderStages = GemmaStages;
    type Stages = GemmaStages;
    /// `[n_i, text_hidden]` per image.
    type Rows = Vec<f32>;

    /// Validation (dropping padding rows), patch rows in the GEMM precision, positions and
    /// segments, with no device involved.
    fn prepare_host(
        cfg: &GemmaConfig,
        precision: Precision,
        images: &[GemmaImage<'_>],
    ) -> CudaResult<GemmaHostBatch> {
        let mut kept = Vec::with_capacity(images.len());
        let mut pos = Vec::new();
        let mut cu = vec![0i32];
        let mut grids = Vec::with_capacity(images.len());
        let mut rows_per = Vec::with_capacity(images.len());
        if images.is_empty() {
            return Err(GemmaError::Input("no images".into()).into());
        }
        // The host path's checks in its order (image by image: the grid, then the values), with
        // the values' finiteness checked while they are converted, in the same pass.
        for (index, img) in images.iter().enumerate() {
            let Grid {
                patches,
                positions,
                gw,
                gh,
            } = match validate_grid(cfg, img, index) {
                Ok(grid) => grid,
                Err(e) => {
                    let earlier = kept.iter().position(|p: &Cow<'_, [f32]>| !all_finite(p));
                    return Err(earlier.map_or(e, non_finite).into());
                }
            };
            let n = positions.len() / 2;
            kept.push(patches);
            pos.extend_from_slice(&positions);
            let bad = |m: String| GemmaError::Input(format!("image {index}: {m}"));
            let last = *cu.last().unwrap_or(&0);
            let next = i32::try_from(last as usize + n)
                .map_err(|_| bad("more than 2³¹ tokens in one batch".into()))?;
            cu.push(next);
            grids.push((gw, gh));
            rows_per.push((gw / cfg.pool) * (gh / cfg.pool));
        }
        let mut layout: Vec<usize> = cu.iter().map(|&c| c as usize).collect();
        layout.extend(grids.iter().flat_map(|&(gw, gh)| [gw, gh]));
        Ok(HostBatch::new(
            GemmaMeta {
                n: pos.len() / 2,
                cu: cu.clone(),
                grids,
            },
            GraphKey { precision, layout },
            rows_per,
            HostInputs {
                // Converted straight from the prepared images (no f32 copy of the batch first).
                rows: HostGemm::from_finite_f32_parts(
                    precision,
                    &kept.iter().map(|p| &p[..]).collect::<Vec<_>>(),
                )
                .map_err(|e| non_finite(e.part))?,
                pos,
                cu,
            },
        ))
    }

    fn grow(&mut self, batch: &GemmaBatch, _keep: bool) -> CudaResult<()> {
        self.ensure_workspace(batch.n, batch.rows())
    }

    fn forward(
        &self,
        ws: &mut Workspace,
        batch: &GemmaBatch,
        keep: bool,
    ) -> CudaResult<Option<GemmaStages>> {
        self.run_in(ws, batch, keep)
    }

    /// Gemma4MultimodalEmbedder's projection of the normed soft tokens to the LM width, into
    /// `out` or the workspace's rows.
    fn project(
        &self,
        ws: &mut Workspace,
        batch: &GemmaBatch,
        out: Option<RowsTarget<'_>>,
    ) -> CudaResult<()> {
        let c = &self.base.cfg;
        self.base.dev.gemm(
            GemmBuffer::inputs(&ws.normed, &self.proj)?,
            None,
            GemmOutput::rows_or(out, &mut ws.rows),
            GemmShape::dense(batch.rows(), c.text_hidden, c.hidden),
            Epilogue::None,
        )?;
        Ok(())
    }

    fn with_rows(&self, mut stages: GemmaStages, _: &GemmaBatch, rows: Vec<f32>) -> GemmaStages {
        stages.rows = rows;
        stages
    }

    fn weight_bytes(&self) -> usize {
        let f = |b: &DeviceBuffer<f32>| 4 * b.len();
        let mut n = self.patch_w.bytes() + f(&self.patch_b) + f(&self.pos) + self.proj.bytes();
        n += f(&self.inv_freq);
        if let Some((a, b)) = &self.std {
            n += f(a) + f(b);
        }
        for l in &self.layers {
            n += f(&l.ln_in) + f(&l.ln_post_attn) + f(&l.ln_pre_ffn) + f(&l.ln_post_ffn);
            n += f(&l.q_norm) + f(&l.k_norm) + l.o.bytes() + l.down.bytes();
            n += l.qkv.iter().map(|g| g.w.bytes()).sum::<usize>();
            n += match &l.mlp {
                Mlp::Joint { gate_up, .. } => gate_up.bytes(),
                Mlp::Split { groups, .. } => groups.iter().map(|g| g.w.bytes()).sum(),
            };
        }
        n
    }

    fn base(&self) -> &TowerBase<GemmaConfig, Workspace> {
        &self.base
    }

    fn base_mut(&mut self) -> &mut TowerBase<GemmaConfig, Workspace> {
        &mut self.base
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_core::{host, HostSource};

    fn lin(out: usize, inp: usize, seed: u32) -> Linear {
        let w = host::test_values(out * inp, seed);
        Linear {
            w,
            out,
            inp,
            clamp_in: Clamp::NONE,
            clamp_out: Clamp::NONE,
        }
    }

    /// The host batch's patch rows are the validated patches (padding rows dropped) converted
    /// value by value with `half`'s `bf16::from_f32` (f16: `f16::from_f32`), bit for bit, and its
    /// positions and segments
    /// are `validate`'s: two release-size images (48×36 and 36×36 grids of 3·16² values, one
    /// with padding rows), rounding ties and signed zeros among the values.
    #[test]
    fn prepare_host_rows_are_the_validated_patches_in_bf16() {
        let config: serde_json::Value = serde_json::from_slice(
            &std::fs::read(
                std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../../fixtures/models/gemma4/config.json"),
            )
            .expect("config"),
        )
        .expect("config JSON");
        let mut cfg = GemmaConfig::from_hf(&config, 10240, false).expect("config");
        cfg.patch = 16;
        let pd = cfg.patch_dim();
        let grid = |gw: usize, gh: usize, pad: usize| -> Vec<i64> {
            let mut pos: Vec<i64> = (0..gw * gh)
                .flat_map(|i| [(i % gw) as i64, (i / gw) as i64])
                .collect();
            pos.extend(std::iter::repeat_n(-1, 2 * pad));
            pos
        };
        let pool = cfg.pool.max(1);
        let (a, b) = (grid(16 * pool, 12 * pool, 0), grid(12 * pool, 12 * pool, 7));
        let mut x = 0x2545_F491u32;
        let mut vals = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|i| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    match i % 5 {
                        0 => f32::from_bits((x & 0x3FFF_0000) | 0x8000),
                        1 => -0.0,
                        _ => x as f32 / u32::MAX as f32,
                    }
                })
                .collect()
        };
        let (pa, pb) = (vals(a.len() / 2 * pd), vals(b.len() / 2 * pd));
        let images = [
            GemmaImage {
                patches: &pa,
                positions: &a,
            },
            GemmaImage {
                patches: &pb,
                positions: &b,
            },
        ];
        let host = GemmaCuda::prepare_host(&cfg, Precision::Bf16, &images).expect("prepare_host");
        let grids: Vec<Grid<'_>> = images
            .iter()
            .enumerate()
            .map(|(i, img)| crate::forward::validate(&cfg, img, i).expect("valid"))
            .collect();
        let want: Vec<u16> = grids
            .iter()
            .flat_map(|g| {
                g.patches
                    .iter()
                    .map(|&v| gpu_core::bf16::from_f32(v).to_bits())
            })
            .collect();
        let HostGemm::Bf16(rows) = &host.inputs().rows else {
            panic!("bf16 asked")
        };
        assert!(rows.iter().map(|v| v.to_bits()).eq(want.iter().copied()));
        // f16 likewise, with `half`'s `f16::from_f32`
        let h16 = GemmaCuda::prepare_host(&cfg, Precision::F16, &images).expect("prepare_host");
        let HostGemm::F16(rows16) = &h16.inputs().rows else {
            panic!("f16 asked")
        };
        let want16 = grids.iter().flat_map(|g| {
            g.patches
                .iter()
                .map(|&v| gpu_core::f16::from_f32(v).to_bits())
        });
        assert!(rows16.iter().map(|v| v.to_bits()).eq(want16));
        assert_eq!(h16.inputs().pos, host.inputs().pos);
        let pos: Vec<i32> = grids.iter().flat_map(|g| g.positions.clone()).collect();
        assert_eq!(host.inputs().pos, pos);
        let n0 = (grids[0].positions.len() / 2) as i32;
        let n1 = (grids[1].positions.len() / 2) as i32;
        assert_eq!(host.inputs().cu, [0, n0, n0 + n1]);
    }

    /// Zero-padded heads (hd 24 → kernel 64) compute the same q/k/v lanes and the same o output.
    #[test]
    fn padded_heads_are_exact() {
        let (heads, hd, kd, h, n) = (3, 24, 64, 40, 5);
        let x: Vec<f32> = (0..n * h).map(|i| (i % 17) as f32 / 8.0 - 1.0).collect();
        let q = lin(heads * hd, h, 1);
        let y = host::gemm(&x, &q.w, None, n, heads * hd, h);
        let qp = pad_rows(&q, heads, hd, kd).expect("hd 24 pads to 64");
        let yp = host::gemm(&x, &qp, None, n, heads * kd, h);
        for t in 0..n {
            for head in 0..heads {
                for r in 0..kd {
                    let got = yp[t * heads * kd + head * kd + r];
                    let want = if r < hd {
                        y[t * heads * hd + head * hd + r]
                    } else {
                        0.0
                    };
                    assert_eq!(got, want, "token {t} head {head} lane {r}");
                }
            }
        }
        let o = lin(h, heads * hd, 2);
        let out = host::gemm(&y, &o.w, None, n, h, heads * hd);
        let op = pad_cols(&o, heads, hd, kd).expect("hd 24 pads to 64");
        let out_p = host::gemm(&yp, &op, None, n, h, heads * kd);
        assert_eq!(out, out_p);
        // Unpadded heads upload the store as it is.
        assert!(pad_rows(&q, heads, hd, hd).is_none() && pad_cols(&o, heads, hd, hd).is_none());
        assert_eq!(weight(&q, &None).to_f32_vec(), q.w);
    }
}
