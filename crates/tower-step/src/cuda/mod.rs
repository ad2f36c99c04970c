//! The Step-3.7 tower on a CUDA device: the same op sequence as [`crate::forward_host`], on
//! gpu-core's kernels and cuBLASLt GEMMs, for every view (crop tiles and global views) of many
//! images in one padding-free pass (one attention segment per view).
//!
//! **Architecture Invariant:** nothing is copied to the host inside [`DeviceTower::run`]; only the
//! stages (when asked) and the final rows ([`DeviceTower::rows`]) come back.
//!
//! Layout on the device:
//! - linear weights in bf16 ([`Precision::Bf16`], the product mode), f16 ([`Precision::F16`]:
//!   bf16's path in IEEE half, for tiers without bf16; its rows are checked finite) or f32
//!   ([`Precision::F32`], the exactness mode: f32 GEMMs, rope, attention and activation);
//!   norms, the position tables and the residual stream in f32;
//! - LayerScale folded at upload (in f32, before any bf16 rounding): `λ ⊙ (a·Wᵀ + b)` =
//!   `a·(λ ⊙ W)ᵀ + λ ⊙ b`, so out_proj and c_proj accumulate straight into the f32 residual
//!   stream (`GemmShape::accumulate`, beta = 1): no add kernel, no LayerScale kernel, no `y` buffer;
//! - a GEMM whose output is in the GEMM precision (qkv, fc1, the two convolutions) takes its
//!   bias in that precision, one into f32 (out_proj, c_proj, the rows) an f32 bias;
//! - fc1 and its activation are one [`ActLinear`]: the GEMM and the activation pass (the fused kernel
//!   lost on fc1 in the tower, `gpu_core::fuses`);
//! - the patch rows and the patch weight get zero columns up to a multiple of 8 (588 → 592), so
//!   the bf16 GEMM's rows start 16-byte aligned;
//! - the position table for each grid size is resized (bilinear, align_corners = false) once and
//!   cached on the device; each view's table is copied into the patch-embedding buffer and the
//!   patch GEMM accumulates onto it;
//! - inside a batch the views are grouped by grid size (stable, first appearance first): the
//!   3×3 stride-2 convolutions then run once per grid size over all its views, as im2col + GEMM.
//!   bf16 and f16: gpu-core's `im2col_3x3s2` (columns (c, ky, kx), the checkpoint's weight as is); f32:
//!   strided copies with the weight's columns permuted to (ky, kx, c) at upload (gpu-core's
//!   im2col is 16-bit only). Rows come back in upstream order ([`DeviceTower::rows`]);
//! - bf16 and f16 modes: head dims the tensor-core attention kernels lack (they exist for 64, 72, 96; the
//!   fixtures' mini towers have 16) are zero-padded to the next one: zero q/k/v weight rows and
//!   biases, zero out_proj columns, so the padded lanes contribute exact zeros.
use std::sync::Arc;

use gpu_core::{
    bf16, conv3x3s2_out, f16, rope_inv_freq, ActLinear, Activation, Batch, Clamp, DeviceBuffer,
    DeviceTower, Epilogue, FusedAct, GemmBias, GemmBuffer, GemmOutput, GemmShape, GraphKey,
    HalfElem, HostBatch, HostGemm, HostInputs, InputBuffers, Mat, PassRows, PassWorkspace, QkNorm,
    RopeLayout, RowsTarget, Stager, TensorStore, TowerBase,
};

use crate::config::StepConfig;
use crate::error::StepError;
use crate::forward::{
    attention_scale, first_non_finite, grid_positions, validate_images_deferring_values, StepImage,
    StepRows, StepStages,
};
use crate::weights::StepWeights;

mod fold;
mod forward;
mod plan;

use fold::*;
pub use plan::StepMeta;
use plan::*;

/// The device type, its error and the precision of the GEMMs, re-exported for callers of this path.
pub use gpu_core::{Device, GpuError, Precision};

/// Everything the CUDA path can fail with: gpu-core's one CUDA error over this family's
/// [`StepError`] (the weights or the input are wrong).
pub type CudaError = gpu_core::CudaError<StepError>;

/// Short for `Result<T, CudaError>`.
pub type CudaResult<T> = std::result::Result<T, CudaError>;

/// Taps of the downsamplers' 3×3 kernels (`Step3p7VisionModel.downsampler{1,2}`,
/// modeling_step3p7.py: `kernel_size=3, stride=2, padding=1`).
const CONV_TAPS: usize = 9;

/// One encoder layer on the device.
#[derive(Debug)]
struct DevLayer {
    ln1_w: DeviceBuffer<f32>,
    ln1_b: DeviceBuffer<f32>,
    /// q | k | v `[3·heads·kd, H]`, rows padded per head.
    qkv: GemmBuffer,
    qkv_b: GemmBuffer,
    /// `λ1 ⊙ out_proj` `[H, heads·kd]`, columns padded per head.
    out: GemmBuffer,
    /// `λ1 ⊙ out_proj.bias` (f32: the GEMM accumulates into the residual stream).
    out_b: DeviceBuffer<f32>,
    ln2_w: DeviceBuffer<f32>,
    ln2_b: DeviceBuffer<f32>,
    /// fc1 `[I, H]` with its bias and the activation.
    fc1: ActLinear,
    /// `λ2 ⊙ c_proj` `[H, I]`.
    fc2: GemmBuffer,
    /// `λ2 ⊙ c_proj.bias`.
    fc2_b: DeviceBuffer<f32>,
}

/// A batch of validated views prepared on the host ([`DeviceTower::prepare_host`]): patch rows in
/// the GEMM precision, rope positions and attention segments, ready for [`DeviceTower::stage`].
/// Building one needs no device, so it can run on another thread while the device works.
pub type StepHostBatch = HostBatch<StepMeta>;

/// A batch of validated views on the device: pixels, rope positions, attention segments and
/// where each view's rows go.
pub type StepBatch = Batch<StepMeta>;

/// The device buffers of a pass, sized for up to `cap` tokens, `cap1`/`cap2` downsampler rows
/// (opaque: kept in the tower's [`PassRunner`] between calls).
#[derive(Debug)]
pub struct Workspace {
    /// The fixed input buffers every forward reads (patch rows, positions, segments).
    inp: InputBuffers,
    cap: usize,
    cap1: usize,
    cap2: usize,
    /// Widest first-downsampler output grid (f32 mode: the zero source's rows).
    capw: usize,
    /// Residual stream `[N, H]`.
    x: DeviceBuffer<f32>,
    /// Patch embedding + position table `[N, H]` (ln_pre's input).
    y: DeviceBuffer<f32>,
    /// Pre-norms `[N, H]`; bf16 and f16 modes: afterwards the blocks' output cast for the convolutions.
    hn: GemmBuffer,
    qkv: GemmBuffer,
    /// Attention output `[N, heads·kd]`; bf16 and f16 modes: afterwards a later grid size's conv input,
    /// moved to offset 0 (gpu-core's im2col reads from the start of its buffer).
    attn: GemmBuffer,
    /// fc1 output and its activation `[N, I]`.
    f: GemmBuffer,
    col1: GemmBuffer,
    d1: GemmBuffer,
    col2: GemmBuffer,
    d2: GemmBuffer,
    rows: DeviceBuffer<f32>,
    /// f32 mode: zeros for the convolutions' padding taps.
    zeros: Option<DeviceBuffer<f32>>,
}

impl PassWorkspace for Workspace {
    fn inputs_mut(&mut self) -> &mut InputBuffers {
        &mut self.inp
    }
    fn rows(&self) -> &DeviceBuffer<f32> {
        &self.rows
    }
}

/// Per image its crops' rows in crop order, then the global view's (upstream order), with the
/// newline mask.
impl PassRows<StepMeta> for StepRows {
    fn split(batch: &StepBatch, all: &[f32], width: usize) -> Vec<StepRows> {
        batch.plan.split_rows(all, width, &batch.masks)
    }
}

/// The Step-3.7 tower's weights on a CUDA device, with the resized position tables and a
/// workspace kept between calls.
#[derive(Debug)]
pub struct StepCuda {
    rope: RopeLayout,
    patch: GemmBuffer,
    /// The learned table `[side², H]`.
    pos: DeviceBuffer<f32>,
    /// Tables resized to other grids, computed once per grid size.
    tables: Vec<((usize, usize), DeviceBuffer<f32>)>,
    ln_pre_w: DeviceBuffer<f32>,
    ln_pre_b: DeviceBuffer<f32>,
    layers: Vec<DevLayer>,
    /// `[2H, 9H]`: bf16 and f16 columns (c, ky, kx); f32 columns (ky, kx, c).
    down1: GemmBuffer,
    down1_b: GemmBuffer,
    /// `[4H, 18H]`, columns as `down1`.
    down2: GemmBuffer,
    down2_b: GemmBuffer,
    proj: GemmBuffer,
    proj_b: Option<DeviceBuffer<f32>>,
    inv_freq: DeviceBuffer<f32>,
    /// Device, config, precision, kernel head dim, graphs and workspace.
    base: TowerBase<StepConfig, Workspace>,
}

impl StepCuda {
    /// Uploads `w` once (see the module docs for the layout). Tensors the layout keeps as the
    /// file has them go from their store (host f32, or the memory-mapped file's bytes) straight
    /// into page-locked staging in the GEMM precision, chunk by chunk; the ones it transforms
    /// (LayerScale folds, head padding, conv columns) are built in f32 one at a time.
    pub fn new<T: TensorStore>(
        dev: Arc<Device>,
        cfg: &StepConfig,
        w: &StepWeights<T>,
        precision: Precision,
    ) -> CudaResult<StepCuda> {
        let (h, hd) = (cfg.hidden, cfg.head_dim);
        let base = TowerBase::new(dev.clone(), cfg.clone(), precision, hd, cfg.text_hidden)?;
        let kd = base.kd;
        if w.layers.len() != cfg.layers {
            return Err(CudaError::Unsupported(format!(
                "{} layers for a config of {}",
                w.layers.len(),
                cfg.layers
            )));
        }
        let p = precision;
        let d = &*dev;
        let mut st = Stager::new(d)?;
        let small = |t: &T| -> CudaResult<DeviceBuffer<f32>> { Ok(d.upload(&t.to_f32_vec())?) };
        let mut layers = Vec::with_capacity(w.layers.len());
        for l in &w.layers {
            let hl = HostLayer::new(cfg, l, kd);
            let qkv = match &hl.qkv {
                Some(padded) => st.upload_gemm(d, p, padded)?,
                None => st.upload_gemm(d, p, &l.qkv_w)?,
            };
            layers.push(DevLayer {
                ln1_w: small(&l.ln1_w)?,
                ln1_b: small(&l.ln1_b)?,
                qkv,
                qkv_b: st.upload_gemm(d, p, &hl.qkv_b)?,
                out: match &hl.out {
                    Some(padded) => st.upload_gemm(d, p, padded)?,
                    None => {
                        let src = ScaledRows {
                            src: &l.out_w,
                            scale: &hl.ls1,
                            cols: h,
                        };
                        st.upload_gemm(d, p, &src)?
                    }
                },
                out_b: d.upload(&hl.out_b)?,
                ln2_w: small(&l.ln2_w)?,
                ln2_b: small(&l.ln2_b)?,
                fc1: ActLinear::upload(
                    &mut st,
                    d,
                    p,
                    &l.fc1_w,
                    Some(&l.fc1_b.to_f32_vec()),
                    cfg.intermediate,
                    h,
                    FusedAct::Plain {
                        act: cfg.activation,
                        input: Clamp::NONE,
                        output: Clamp::NONE,
                    },
                )?,
                fc2: st.upload_gemm(
                    d,
                    p,
                    &ScaledRows {
                        src: &l.fc2_w,
                        scale: &hl.ls2,
                        cols: cfg.intermediate,
                    },
                )?,
                fc2_b: d.upload(&hl.fc2_b)?,
            });
        }
        let mut conv = |wt: &T, c: usize| -> CudaResult<GemmBuffer> {
            Ok(match p {
                Precision::Bf16 | Precision::F16 => st.upload_gemm(d, p, wt)?,
                Precision::F32 => {
                    st.upload_gemm(d, p, &taps_major(&wt.to_f32_vec(), c, CONV_TAPS))?
                }
            })
        };
        let (down1, down2) = (conv(&w.down1_w, h)?, conv(&w.down2_w, 2 * h)?);
        let t = StepCuda {
            rope: w.layout.rope(),
            patch: st.upload_gemm(d, p, &pad_cols(&w.patch.to_f32_vec(), cfg.patch_dim()))?,
            pos: small(&w.pos)?,
            tables: Vec::new(),
            ln_pre_w: small(&w.ln_pre_w)?,
            ln_pre_b: small(&w.ln_pre_b)?,
            layers,
            down1,
            down1_b: st.upload_gemm(d, p, &w.down1_b)?,
            down2,
            down2_b: st.upload_gemm(d, p, &w.down2_b)?,
            proj: st.upload_gemm(d, p, &w.proj)?,
            proj_b: w.proj_b.as_ref().map(small).transpose()?,
            inv_freq: d.upload(&rope_inv_freq(hd, cfg.rope_theta))?,
            base,
        };
        dev.synchronize()?;
        drop(st);
        Ok(t)
    }

    /// Loads the tower from `ck` as views of the memory-mapped file and uploads it in
    /// `precision`: the model is never held in f32 on the host ([`crate::load_mapped`]).
    pub fn from_checkpoint(
        dev: Arc<Device>,
        ck: &st_reader::Checkpoint,
        precision: Precision,
    ) -> CudaResult<StepCuda> {
        let config = ck
            .config()
            .ok_or_else(|| StepError::Config("the checkpoint has no config.json".into()))?;
        let (cfg, w) = crate::load_mapped(ck, config)?;
        StepCuda::new(dev, &cfg, &w, precision)
    }

    /// Resizes the position table to every grid of `batch` not seen before (once per size).
    fn ensure_tables(&mut self, batch: &StepBatch) -> CudaResult<()> {
        let (t, h) = (self.base.cfg.pos_side, self.base.cfg.hidden);
        for r in &batch.plan.runs {
            let key = (r.gh, r.gw);
            if key == (t, t) || self.tables.iter().any(|(k, _)| *k == key) {
                continue;
            }
            let mut out = self.base.dev.alloc::<f32>(r.gh * r.gw * h)?;
            self.base
                .dev
                .bilinear_resize(&self.pos, t, t, &mut out, r.gh, r.gw, h)?;
            self.tables.push((key, out));
        }
        Ok(())
    }

    fn table(&self, gh: usize, gw: usize) -> CudaResult<&DeviceBuffer<f32>> {
        let t = self.base.cfg.pos_side;
        if (gh, gw) == (t, t) {
            return Ok(&self.pos);
        }
        self.tables
            .iter()
            .find(|(k, _)| *k == (gh, gw))
            .map(|(_, b)| b)
            .ok_or_else(|| CudaError::Unsupported(format!("no position table for {gh}×{gw}")))
    }

    fn ensure_workspace(&mut self, b: &ViewPlan) -> CudaResult<()> {
        let capw = b
            .views
            .iter()
            .map(|v| conv3x3s2_out(v.gw))
            .max()
            .unwrap_or(1);
        if let Some(ws) = self.base.passes.workspace() {
            if ws.cap >= b.n && ws.cap1 >= b.n1 && ws.cap2 >= b.n2 && ws.capw >= capw {
                return Ok(());
            }
        }
        let (cap, cap1, cap2, capw) = match self.base.passes.workspace() {
            Some(ws) => (
                ws.cap.max(b.n),
                ws.cap1.max(b.n1),
                ws.cap2.max(b.n2),
                ws.capw.max(capw),
            ),
            None => (b.n, b.n1, b.n2, capw),
        };
        let c = &self.base.cfg;
        let (h, wp, i) = (c.hidden, c.heads * self.base.kd, c.intermediate);
        let d = &*self.base.dev;
        let p = self.base.precision;
        self.base.passes.regrow(|| -> CudaResult<Workspace> {
            Ok(Workspace {
                inp: InputBuffers::alloc(d, p, cap * patch_k(c), 2 * cap, cap + 1)?,
                cap,
                cap1,
                cap2,
                capw,
                x: d.alloc(cap * h)?,
                y: d.alloc(cap * h)?,
                hn: GemmBuffer::alloc(d, p, cap * h)?,
                qkv: GemmBuffer::alloc(d, p, cap * 3 * wp)?,
                attn: GemmBuffer::alloc(d, p, cap * wp)?,
                f: GemmBuffer::alloc(d, p, cap * i)?,
                col1: GemmBuffer::alloc(d, p, cap1 * CONV_TAPS * h)?,
                d1: GemmBuffer::alloc(d, p, cap1 * 2 * h)?,
                col2: GemmBuffer::alloc(d, p, cap2 * CONV_TAPS * 2 * h)?,
                d2: GemmBuffer::alloc(d, p, cap2 * c.out_width())?,
                rows: d.alloc(cap2 * c.text_hidden)?,
                zeros: match p {
                    Precision::F32 => Some(d.alloc_zeros(capw * 2 * h)?),
                    Precision::Bf16 | Precision::F16 => None,
                },
            })
        })?;
        Ok(())
    }
}

impl DeviceTower for StepCuda {
    type Config = StepConfig;
    type Image<'a> = StepImage<'a>;
    type Meta = StepMeta;
    type Family = StepError;
    type Workspace = Workspace;
    type EncoderStages = HostStages;
    type Stages = StepStages;
    /// Per image its crops' rows in crop order, then the global view's (upstream order), with
    /// the newline mask.
    type Rows = StepRows;

    /// Validation (the host path's checks), every view's patch rows (in the GEMM precision),
    /// rope positions and attention segment, views grouped by grid size (see the module docs),
    /// with no device involved.
    fn prepare_host(
        cfg: &StepConfig,
        precision: Precision,
        images: &[StepImage<'_>],
    ) -> CudaResult<StepHostBatch> {
        // The host path's checks in its order, with the values of the views whose patches read
        // every pixel checked while they are converted (one pass over the pixels, not two).
        let grids = validate_images_deferring_values(cfg, images)?;
        if grids.is_empty() {
            return Err(StepError::Input("no images".into()).into());
        }
        let plan = match ViewPlan::new(&grids) {
            Ok(plan) => plan,
            Err(e) => return Err(first_non_finite(&grids).map_or(e, |g| g.non_finite().into())),
        };
        let mut pos = Vec::new();
        for &i in &plan.order {
            pos.extend(grid_positions(grids[i].gh, grids[i].gw));
        }
        let k = cfg.patch_dim().next_multiple_of(8);
        /// The rows in their [`HostGemm`] variant, beside the first view with a non-finite value.
        fn wrap<T>(
            variant: impl FnOnce(Vec<T>) -> HostGemm,
            (rows, non_finite): (Vec<T>, Option<usize>),
        ) -> (HostGemm, Option<usize>) {
            (variant(rows), non_finite)
        }
        let (rows, non_finite) = match precision {
            // bf16 into a kept conversion buffer (no fresh memory per encode: docs/PERF.md v0.7)
            Precision::Bf16 => wrap(
                HostGemm::Bf16,
                patch_rows(
                    &grids,
                    &plan.order,
                    cfg.patch,
                    k,
                    bf16::from_f32,
                    gpu_core::recycled_bf16,
                ),
            ),
            // f16: normalised pixels, far inside f16's range
            Precision::F16 => wrap(
                HostGemm::F16,
                patch_rows(&grids, &plan.order, cfg.patch, k, f16::from_f32, |n| {
                    vec![f16::ZERO; n]
                }),
            ),
            Precision::F32 => wrap(
                HostGemm::F32,
                patch_rows(&grids, &plan.order, cfg.patch, k, |x| x, |n| vec![0.0; n]),
            ),
        };
        if let Some(g) = non_finite.and_then(|i| grids.get(i)) {
            return Err(g.non_finite().into());
        }
        let cu = plan.cu_seqlens();
        let key = GraphKey {
            precision,
            layout: plan.views.iter().flat_map(|v| [v.gh, v.gw]).collect(),
        };
        let rows_per = plan.rows_per_image(images.len());
        Ok(HostBatch::new(
            StepMeta {
                cu: cu.clone(),
                plan,
                masks: images.iter().map(|i| i.newline_mask.clone()).collect(),
            },
            key,
            rows_per,
            HostInputs { rows, pos, cu },
        ))
    }

    /// The position tables of the batch's grids, then the workspace.
    fn grow(&mut self, batch: &StepBatch, _keep: bool) -> CudaResult<()> {
        self.ensure_tables(batch)?;
        self.ensure_workspace(&batch.plan)
    }

    fn forward(
        &self,
        ws: &mut Workspace,
        batch: &StepBatch,
        keep: bool,
    ) -> CudaResult<Option<HostStages>> {
        self.run_in(ws, batch, keep)
    }

    /// The projector (modeling_step3p7.py:958-960) from the device-order downsampler rows to
    /// the LM width, written in upstream order (per image: crops, then global) into `out` or
    /// the workspace's rows: one GEMM per piece of views contiguous on both sides.
    fn project(
        &self,
        ws: &mut Workspace,
        batch: &StepBatch,
        mut out: Option<RowsTarget<'_>>,
    ) -> CudaResult<()> {
        let c = &self.base.cfg;
        let (t, w) = (c.text_hidden, c.out_width());
        for (src, rows, dst) in batch.plan.out_pieces() {
            let y = GemmOutput::rows_or(out.as_mut().map(RowsTarget::reborrow), &mut ws.rows);
            self.base.dev.gemm(
                GemmBuffer::inputs(&ws.d2, &self.proj)?,
                self.proj_b.as_ref().map(GemmBias::F32),
                y,
                GemmShape {
                    x_offset: src * w,
                    y_offset: dst * t,
                    ..GemmShape::dense(rows, t, w)
                },
                Epilogue::None,
            )?;
        }
        Ok(())
    }

    fn with_rows(&self, stages: HostStages, batch: &StepBatch, rows: Vec<f32>) -> StepStages {
        stages.assemble(&batch.plan, self.base.cfg.hidden, rows)
    }

    fn weight_bytes(&self) -> usize {
        let f = |b: &DeviceBuffer<f32>| 4 * b.len();
        let mut n = self.patch.bytes() + f(&self.pos) + f(&self.ln_pre_w) + f(&self.ln_pre_b);
        n += self.down1.bytes() + self.down1_b.bytes() + self.down2.bytes();
        n += self.down2_b.bytes() + self.proj.bytes() + self.proj_b.as_ref().map_or(0, f);
        n += f(&self.inv_freq);
        for l in &self.layers {
            n += f(&l.ln1_w) + f(&l.ln1_b) + f(&l.ln2_w) + f(&l.ln2_b);
            n += l.qkv.bytes() + l.qkv_b.bytes() + l.out.bytes() + f(&l.out_b);
            n += l.fc1.bytes() + l.fc2.bytes() + f(&l.fc2_b);
        }
        n
    }

    fn base(&self) -> &TowerBase<StepConfig, Workspace> {
        &self.base
    }

    fn base_mut(&mut self) -> &mut TowerBase<StepConfig, Workspace> {
        &mut self.base
    }
}

#[cfg(test)]
mod tests;
