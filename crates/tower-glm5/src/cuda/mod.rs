//! The GLM vision towers (glm5_next, glm_ocr) on a CUDA device: the same op sequence as
//! [`crate::forward_host`], on gpu-core's kernels and cuBLASLt GEMMs, for many images (and video
//! frame pairs) of different sizes in one padding-free pass (one attention segment per frame).
//!
//! **Architecture Invariant:** nothing is copied to the host inside [`DeviceTower::run`]; only the
//! stages (when asked) and the final rows ([`DeviceTower::rows`]) come back.
//!
//! Layout on the device:
//! - linear weights in bf16 ([`Precision::Bf16`], the product mode), f16 ([`Precision::F16`]:
//!   bf16's path in IEEE half, for tiers without bf16; its rows are checked finite) or f32
//!   ([`Precision::F32`], the exactness mode: f32 GEMMs, f32 norm + rope, f32 attention,
//!   f32 gated activation); norms, biases and the residual stream in f32;
//! - q|k|v is the checkpoint's fused `[3H, H]` weight; gate|up are fused into one `[2I, H]`
//!   (and the merger's into `[2Pi, O]`), biases concatenated; a GEMM with an f32 output (into
//!   the residual stream, the downsample, the rows) takes its bias in f32, one with an output in
//!   the GEMM precision (qkv, gate|up) in that precision (an f32 bias on a 16-bit output is refused);
//! - gate|up and the gate are one [`ActLinear`]: in bf16 on compute capability 9.0 one fused GEMM
//!   (rows interleaved in groups of 8 at upload, no `[N, 2I]` buffer), else (f16, f32, other tiers)
//!   the GEMM and the gate pass;
//! - the residual adds are the GEMMs' `accumulate` (`x += y·Wᵀ + b`, beta = 1 into the f32
//!   stream): no separate add kernel and no `y` buffer;
//! - the m×m stride-m downsample conv reads the post-norm rows as `[N/m², m²·H]` directly: the
//!   processor emits tokens block-major (m² consecutive tokens per output row), so with the
//!   weight's columns permuted once from (c, ky, kx) to (ky, kx, c) the conv is one dense GEMM —
//!   the same products as `block_gather_2x2` + GEMM, without the gather kernel or its buffer, and
//!   in either precision (gpu-core's gather is bf16 only);
//! - bf16 and f16 modes: head dims the tensor-core attention kernels lack (they exist for 64, 72, 96; the
//!   fixtures' mini towers have 16) are zero-padded to the next one: zero q/k/v weight rows and
//!   biases, zero proj columns, so the padded lanes contribute exact zeros.
use std::sync::Arc;

use gpu_core::{
    all_finite, pad_head_cols, pad_head_rows, rope_inv_freq, ActLinear, Activation, Batch, Clamp,
    DeviceBuffer, DeviceTower, Epilogue, FusedAct, Gate, GemmBias, GemmBuffer, GemmInputs,
    GemmOutput, GemmShape, GraphKey, HostBatch, HostGemm, HostInputs, HostTensor, InputBuffers,
    Mat, PassWorkspace, QkNorm, RopeLayout, RowsTarget, Stager, TensorStore, TowerBase,
};
use rayon::prelude::*;

use crate::config::{GlmConfig, MERGER_LAYER_NORM_EPS};
use crate::error::GlmError;
use crate::forward::{
    attention_scale, non_finite, validate_shape, vision_cu_seqlens, vision_positions, GlmImage,
    GlmStages,
};
use crate::weights::{GlmWeights, Linear};

mod forward;

/// The device type, its error and the precision of the GEMMs, re-exported for callers of this path.
pub use gpu_core::{Device, GpuError, Precision};

/// Everything the CUDA path can fail with: gpu-core's one CUDA error over this family's
/// [`GlmError`] (the weights or the input are wrong).
pub type CudaError = gpu_core::CudaError<GlmError>;

/// Short for `Result<T, CudaError>`.
pub type CudaResult<T> = std::result::Result<T, CudaError>;

/// An f32 bias (GEMMs into f32 outputs: the residual stream, the downsample, the rows).
fn bias(b: &Option<DeviceBuffer<f32>>) -> Option<GemmBias<'_>> {
    b.as_ref().map(GemmBias::F32)
}

/// A bias in the GEMM precision (GEMMs whose output is in that precision; see
/// [`GemmBuffer::bias`]).
fn out_bias(b: &Option<GemmBuffer>) -> Option<GemmBias<'_>> {
    b.as_ref().map(GemmBuffer::bias)
}

#[derive(Debug)]
struct DevBlock {
    norm1: DeviceBuffer<f32>,
    norm2: DeviceBuffer<f32>,
    qkv: GemmBuffer,
    qkv_b: Option<GemmBuffer>,
    q_norm: DeviceBuffer<f32>,
    k_norm: DeviceBuffer<f32>,
    proj: GemmBuffer,
    proj_b: Option<DeviceBuffer<f32>>,
    /// gate|up `[2·I, H]` with its bias and the gate (one fused kernel where the device has it).
    gate_up: ActLinear,
    down: GemmBuffer,
    down_b: Option<DeviceBuffer<f32>>,
}

/// The device buffers of a pass, sized for up to `cap` tokens and `cap_p` merged rows (opaque:
/// kept in the tower's [`PassRunner`] between calls).
#[derive(Debug)]
pub struct Workspace {
    /// The fixed input buffers every forward reads (patch rows, positions, segments).
    inp: InputBuffers,
    cap: usize,
    cap_p: usize,
    /// Residual stream `[N, H]`.
    x: DeviceBuffer<f32>,
    /// Pre-norms `[N, H]` (and the post-norm the downsample reads as `[N/m², m²H]`).
    hn: GemmBuffer,
    qkv: GemmBuffer,
    attn: GemmBuffer,
    /// gate|up output `[N, 2·I]` of the two-step path (None where the blocks' gate|up is fused).
    gu: Option<GemmBuffer>,
    act: GemmBuffer,
    /// f32 `post_norm` for the stages (only written when they are kept).
    stage: Option<DeviceBuffer<f32>>,
    ds: DeviceBuffer<f32>,
    /// bf16 and f16 modes: the downsample output cast for the merger's first GEMM.
    ds_b: Option<GemmBuffer>,
    m: DeviceBuffer<f32>,
    mn: GemmBuffer,
    /// The merger's gate|up output (None where fused).
    mgu: Option<GemmBuffer>,
    mact: GemmBuffer,
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

/// What a GLM batch is, apart from its input values, its graph key and its rows: tokens and
/// segments.
#[derive(Debug, Clone)]
pub struct GlmMeta {
    n: usize,
    cu: Vec<i32>,
}

impl GlmMeta {
    /// Patches (tokens) in the batch.
    pub fn tokens(&self) -> usize {
        self.n
    }
    /// The attention segments (one per frame pair), `[segments + 1]`.
    pub fn cu_seqlens(&self) -> &[i32] {
        &self.cu
    }
}

/// A batch of validated images prepared on the host ([`DeviceTower::prepare_host`]), ready for
/// [`DeviceTower::stage`]; building one needs no device.
pub type GlmHostBatch = HostBatch<GlmMeta>;

/// A batch of validated images on the device: pixels, positions and attention segments.
pub type GlmBatch = Batch<GlmMeta>;

/// A GLM vision tower's weights on a CUDA device, with a workspace kept between calls.
#[derive(Debug)]
pub struct GlmCuda {
    patch_w: GemmBuffer,
    patch_b: DeviceBuffer<f32>,
    blocks: Vec<DevBlock>,
    post_norm: DeviceBuffer<f32>,
    /// Downsample `[O, m²H]`, columns permuted to (ky, kx, c).
    ds_w: GemmBuffer,
    ds_b: Option<DeviceBuffer<f32>>,
    m_proj: GemmBuffer,
    m_proj_b: Option<DeviceBuffer<f32>>,
    m_norm_w: DeviceBuffer<f32>,
    m_norm_b: DeviceBuffer<f32>,
    m_gate_up: ActLinear,
    m_down: GemmBuffer,
    m_down_b: Option<DeviceBuffer<f32>>,
    inv_freq: DeviceBuffer<f32>,
    /// Device, config, precision, kernel head dim, graphs and workspace.
    base: TowerBase<GlmConfig, Workspace>,
}

/// The SwiGLU of a config: glm5_next `act(min(g, L))·clamp(u, −L, L)`
/// (modeling_glm5_next.py:1534-1540); glm_ocr `act(g)·u` (modeling_glm_ocr.py:83). The same law
/// as the host path's.
fn swiglu(cfg: &GlmConfig) -> Gate {
    match cfg.swiglu_limit {
        Some(l) => Gate {
            act: cfg.activation,
            ..Gate::swiglu_clamped(l)
        },
        None => Gate::plain(cfg.activation),
    }
}

/// The Conv2d downsample weight `[O, H·u]` with columns (c, j) (j = ky·m + kx, u = m²) as
/// `[O, u·H]` with columns (j, c): the layout of `u` consecutive block-major token rows.
fn permute_downsample(w: &[f32], inp: usize, h: usize, u: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; w.len()];
    out.par_chunks_mut(inp)
        .zip(w.par_chunks(inp))
        .for_each(|(dst, src)| {
            for c in 0..h {
                for j in 0..u {
                    dst[j * h + c] = src[c * u + j];
                }
            }
        });
    out
}

/// `[a; b]` of two linears with the same input (gate|up), stacked at upload without a host
/// copy, and their biases (zeros for a missing one).
fn stack<'t, T: TensorStore>(
    a: &'t Linear<T>,
    b: &'t Linear<T>,
) -> (HostTensor<'t>, Option<Vec<f32>>) {
    let w = HostTensor::Stack(vec![a.w.view(), b.w.view()]);
    let bias = match (&a.b, &b.b) {
        (None, None) => None,
        (ab, bb) => {
            let mut v = ab
                .as_ref()
                .map_or_else(|| vec![0.0; a.out], |x| x.to_f32_vec());
            v.extend(
                bb.as_ref()
                    .map_or_else(|| vec![0.0; b.out], |x| x.to_f32_vec()),
            );
            Some(v)
        }
    };
    (w, bias)
}

/// Rows `[3·heads·hd, inp]` (q | k | v) with each third's rows padded per head to `kd`.
fn pad_qkv(w: &[f32], inp: usize, heads: usize, hd: usize, kd: usize) -> Vec<f32> {
    let third = heads * hd * inp;
    (0..3)
        .flat_map(|part| pad_head_rows(&w[part * third..(part + 1) * third], inp, heads, hd, kd))
        .collect()
}

/// The host batch of validated `images` (`rows` patch rows each; none is refused) around their
/// converted patch rows: rope positions (`vision_positions`), the attention segments (`vision_cu_seqlens`, one per
/// frame pair) and the graph key.
fn host_batch(
    cfg: &GlmConfig,
    precision: Precision,
    images: &[GlmImage<'_>],
    rows: &[usize],
    patch_rows: HostGemm,
) -> CudaResult<GlmHostBatch> {
    if images.is_empty() {
        return Err(GlmError::Input("no images".into()).into());
    }
    let grids: Vec<[usize; 3]> = images.iter().map(|i| i.grid_thw).collect();
    let cu = vision_cu_seqlens(&grids)?;
    let mut pos = Vec::new();
    for img in images {
        pos.extend(vision_positions(img.grid_thw, cfg.merge));
    }
    let unit = cfg.merge_unit();
    let mut layout: Vec<usize> = cu.iter().map(|&c| c as usize).collect();
    layout.extend(grids.iter().flatten());
    Ok(HostBatch::new(
        GlmMeta {
            n: pos.len() / 2,
            cu: cu.clone(),
        },
        GraphKey { precision, layout },
        rows.iter().map(|r| r / unit).collect(),
        HostInputs {
            rows: patch_rows,
            pos,
            cu,
        },
    ))
}

impl GlmCuda {
    /// Uploads `w` once (see the module docs for the layout). Tensors kept as the file has them
    /// go from their store (host f32, or the memory-mapped file's bytes) straight into
    /// page-locked staging in the GEMM precision, chunk by chunk; transformed ones (padded heads,
    /// the permuted downsample) are built in f32 one at a time.
    pub fn new<T: TensorStore>(
        dev: Arc<Device>,
        cfg: &GlmConfig,
        w: &GlmWeights<T>,
        precision: Precision,
    ) -> CudaResult<GlmCuda> {
        let (h, heads, hd) = (cfg.hidden, cfg.heads, cfg.head_dim);
        let base = TowerBase::new(dev.clone(), cfg.clone(), precision, hd, cfg.text_hidden)?;
        let kd = base.kd;
        if cfg.merge == 0 || w.blocks.len() != cfg.layers {
            return Err(CudaError::Unsupported(format!(
                "merge {} / {} blocks for {} layers",
                cfg.merge,
                w.blocks.len(),
                cfg.layers
            )));
        }
        let p = precision;
        let d = &*dev;
        let mut st = Stager::new(d)?;
        let f32s = |st: &mut Stager, t: &T| -> CudaResult<DeviceBuffer<f32>> {
            Ok(st.upload::<f32>(d, t)?)
        };
        let opt = |st: &mut Stager, t: &Option<T>| -> CudaResult<Option<DeviceBuffer<f32>>> {
            t.as_ref().map(|t| f32s(st, t)).transpose()
        };
        let gate = swiglu(cfg);
        let gate_up = |st: &mut Stager, g: &Linear<T>, u: &Linear<T>| -> CudaResult<ActLinear> {
            let (gu, gu_b) = stack(g, u);
            Ok(ActLinear::upload(
                st,
                d,
                p,
                &gu,
                gu_b.as_deref(),
                g.out + u.out,
                g.inp,
                FusedAct::Gated(gate),
            )?)
        };
        let mut blocks = Vec::with_capacity(w.blocks.len());
        for b in &w.blocks {
            // qkv rows are q | k | v, each [heads·hd]: padded per head when the kernel needs it.
            let qkv = if kd == hd {
                st.upload_gemm(d, p, &b.qkv.w)?
            } else {
                st.upload_gemm(d, p, &pad_qkv(&b.qkv.w.to_f32_vec(), h, heads, hd, kd))?
            };
            let qkv_b = b
                .qkv
                .b
                .as_ref()
                .map(|bias| pad_qkv(&bias.to_f32_vec(), 1, heads, hd, kd));
            let proj = if kd == hd {
                st.upload_gemm(d, p, &b.proj.w)?
            } else {
                let padded = pad_head_cols(&b.proj.w.to_f32_vec(), b.proj.out, heads, hd, kd);
                st.upload_gemm(d, p, &padded)?
            };
            blocks.push(DevBlock {
                norm1: f32s(&mut st, &b.norm1)?,
                norm2: f32s(&mut st, &b.norm2)?,
                qkv,
                qkv_b: GemmBuffer::upload_opt(d, p, qkv_b.as_deref())?,
                q_norm: f32s(&mut st, &b.q_norm)?,
                k_norm: f32s(&mut st, &b.k_norm)?,
                proj,
                proj_b: opt(&mut st, &b.proj.b)?,
                gate_up: gate_up(&mut st, &b.gate, &b.up)?,
                down: st.upload_gemm(d, p, &b.down.w)?,
                down_b: opt(&mut st, &b.down.b)?,
            });
        }
        let patch_b = w
            .patch
            .b
            .as_ref()
            .map_or_else(|| vec![0.0; w.patch.out], |b| b.to_f32_vec());
        let ds = &w.downsample;
        let ds_w = permute_downsample(&ds.w.to_f32_vec(), ds.inp, h, cfg.merge_unit());
        let t = GlmCuda {
            patch_w: st.upload_gemm(d, p, &w.patch.w)?,
            patch_b: d.upload(&patch_b)?,
            blocks,
            post_norm: f32s(&mut st, &w.post_norm)?,
            ds_w: st.upload_gemm(d, p, &ds_w)?,
            ds_b: opt(&mut st, &w.downsample.b)?,
            m_proj: st.upload_gemm(d, p, &w.merger_proj.w)?,
            m_proj_b: opt(&mut st, &w.merger_proj.b)?,
            m_norm_w: f32s(&mut st, &w.merger_norm_w)?,
            m_norm_b: f32s(&mut st, &w.merger_norm_b)?,
            m_gate_up: gate_up(&mut st, &w.merger_gate, &w.merger_up)?,
            m_down: st.upload_gemm(d, p, &w.merger_down.w)?,
            m_down_b: opt(&mut st, &w.merger_down.b)?,
            inv_freq: d.upload(&rope_inv_freq(hd, cfg.rope_theta))?,
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
    ) -> CudaResult<GlmCuda> {
        let (cfg, w) = crate::load_hf_mapped(ck)?;
        GlmCuda::new(dev, &cfg, &w, precision)
    }

    fn ensure_workspace(&mut self, n: usize, np: usize, keep: bool) -> CudaResult<()> {
        if let Some(ws) = self.base.passes.workspace() {
            if ws.cap >= n && ws.cap_p >= np && (!keep || ws.stage.is_some()) {
                return Ok(());
            }
        }
        let (cap, cap_p, had_stage) = match self.base.passes.workspace() {
            Some(ws) => (ws.cap.max(n), ws.cap_p.max(np), ws.stage.is_some()),
            None => (n, np, false),
        };
        let c = &self.base.cfg;
        let (h, wp, mi, o, pi) = (
            c.hidden,
            c.heads * self.base.kd,
            c.intermediate,
            c.text_hidden,
            c.merger_inner,
        );
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
                gu: match self.blocks.first().map(|b| b.gate_up.fused()) {
                    Some(false) => Some(GemmBuffer::alloc(d, p, cap * 2 * mi)?),
                    _ => None,
                },
                act: GemmBuffer::alloc(d, p, cap * mi)?,
                stage: if keep || had_stage {
                    Some(d.alloc(cap * h)?)
                } else {
                    None
                },
                ds: d.alloc(cap_p * o)?,
                ds_b: match p {
                    Precision::Bf16 | Precision::F16 => Some(GemmBuffer::alloc(d, p, cap_p * o)?),
                    Precision::F32 => None,
                },
                m: d.alloc(cap_p * o)?,
                mn: GemmBuffer::alloc(d, p, cap_p * o)?,
                mgu: match self.m_gate_up.fused() {
                    false => Some(GemmBuffer::alloc(d, p, cap_p * 2 * pi)?),
                    true => None,
                },
                mact: GemmBuffer::alloc(d, p, cap_p * pi)?,
                rows: d.alloc(cap_p * o)?,
            })
        })?;
        Ok(())
    }
}

impl DeviceTower for GlmCuda {
    type Config = GlmConfig;
    type Image<'a> = GlmImage<'a>;
    type Meta = GlmMeta;
    type Family = GlmError;
    type Workspace = Workspace;
    type EncoderStages = GlmStages;
    type Stages = GlmStages;
    /// `[n_i/m², text_hidden]` per image.
    type Rows = Vec<f32>;

    /// Validation (the host path's checks), patch rows in the GEMM precision, rope positions
    /// (`vision_positions`) and the attention segments (`vision_cu_seqlens`, one per frame
    /// pair), with no device involved.
    fn prepare_host(
        cfg: &GlmConfig,
        precision: Precision,
        images: &[GlmImage<'_>],
    ) -> CudaResult<GlmHostBatch> {
        if images.is_empty() {
            return Err(GlmError::Input("no images".into()).into());
        }
        // The host path's checks in its order (image by image: the shape, then the values), with
        // the values' finiteness checked while they are converted, in the same pass.
        let mut rows = Vec::with_capacity(images.len());
        for (i, img) in images.iter().enumerate() {
            match validate_shape(cfg, img, i) {
                Ok(r) => rows.push(r),
                Err(e) => {
                    return Err(
                        match images[..i].iter().position(|m| !all_finite(m.patches)) {
                            Some(k) => non_finite(k),
                            None => e,
                        }
                        .into(),
                    )
                }
            }
        }
        let parts: Vec<&[f32]> = images.iter().map(|i| i.patches).collect();
        let patch_rows =
            HostGemm::from_finite_f32_parts(precision, &parts).map_err(|e| non_finite(e.part))?;
        host_batch(cfg, precision, images, &rows, patch_rows)
    }

    fn grow(&mut self, batch: &GlmBatch, keep: bool) -> CudaResult<()> {
        self.ensure_workspace(batch.n, batch.rows(), keep)
    }

    fn forward(
        &self,
        ws: &mut Workspace,
        batch: &GlmBatch,
        keep: bool,
    ) -> CudaResult<Option<GlmStages>> {
        self.run_in(ws, batch, keep)
    }

    /// The merger's down projection (SwiGLU output → LM width), into `out` or the workspace's
    /// rows.
    fn project(
        &self,
        ws: &mut Workspace,
        batch: &GlmBatch,
        out: Option<RowsTarget<'_>>,
    ) -> CudaResult<()> {
        let c = &self.base.cfg;
        self.base.dev.gemm(
            GemmBuffer::inputs(&ws.mact, &self.m_down)?,
            bias(&self.m_down_b),
            GemmOutput::rows_or(out, &mut ws.rows),
            GemmShape::dense(batch.rows(), c.text_hidden, c.merger_inner),
            Epilogue::None,
        )?;
        Ok(())
    }

    fn with_rows(&self, mut stages: GlmStages, _: &GlmBatch, rows: Vec<f32>) -> GlmStages {
        stages.rows = rows;
        stages
    }

    fn weight_bytes(&self) -> usize {
        let f = |b: &DeviceBuffer<f32>| 4 * b.len();
        let o = |b: &Option<DeviceBuffer<f32>>| b.as_ref().map_or(0, f);
        let ob = |b: &Option<GemmBuffer>| b.as_ref().map_or(0, GemmBuffer::bytes);
        let mut n = self.patch_w.bytes() + f(&self.patch_b) + f(&self.post_norm);
        n += self.ds_w.bytes() + o(&self.ds_b) + self.m_proj.bytes() + o(&self.m_proj_b);
        n += f(&self.m_norm_w) + f(&self.m_norm_b) + self.m_gate_up.bytes();
        n += self.m_down.bytes() + o(&self.m_down_b);
        for b in &self.blocks {
            n += f(&b.norm1) + f(&b.norm2) + f(&b.q_norm) + f(&b.k_norm);
            n += b.qkv.bytes() + ob(&b.qkv_b) + b.proj.bytes() + o(&b.proj_b);
            n += b.gate_up.bytes() + b.down.bytes() + o(&b.down_b);
        }
        n
    }

    fn base(&self) -> &TowerBase<GlmConfig, Workspace> {
        &self.base
    }

    fn base_mut(&mut self) -> &mut TowerBase<GlmConfig, Workspace> {
        &mut self.base
    }
}

#[cfg(test)]
mod tests;
