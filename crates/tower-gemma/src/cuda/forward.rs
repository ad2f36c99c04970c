//! The forward op sequence on the device (`run_in`, the same ops as [`crate::forward_host`])
//! and its helpers; the tower's upload, staging, graphs and workspace are in `mod.rs`.

use super::*;

impl GemmaCuda {
    /// Pre-norm of `x` into `hn` with `clamp`, in the GEMM precision.
    pub(super) fn norm_into(
        &self,
        x: &DeviceBuffer<f32>,
        w: Option<&DeviceBuffer<f32>>,
        hn: &mut GemmBuffer,
        rows: usize,
        clamp: Clamp,
    ) -> CudaResult<()> {
        let h = self.base.cfg.hidden;
        let m = Mat::dense(rows, h);
        let eps = self.base.cfg.eps as f32;
        Ok(self.base.dev.rms_norm_mixed(x, m, w, hn, m, eps, clamp)?)
    }

    /// `out[:, g.col .. g.col + g.width] = hn · g.wᵀ` for every group, each on its own clamped pre-norm.
    /// `hn` already holds the pre-norm when `prenormed` (one group, no clamp).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn grouped_gemm(
        &self,
        x: &DeviceBuffer<f32>,
        norm_w: &DeviceBuffer<f32>,
        hn: &mut GemmBuffer,
        gs: &[Group],
        out: &mut GemmBuffer,
        ld: usize,
        n: usize,
        prenormed: bool,
    ) -> CudaResult<()> {
        let h = self.base.cfg.hidden;
        for g in gs {
            if !prenormed {
                self.norm_into(x, Some(norm_w), hn, n, g.clamp_in)?;
            }
            let shape = GemmShape {
                ldy: ld,
                y_offset: g.col,
                ..GemmShape::dense(n, g.width, h)
            };
            self.base.dev.gemm(
                GemmBuffer::inputs(hn, &g.w)?,
                None,
                out.out(),
                shape,
                Epilogue::None,
            )?;
        }
        Ok(())
    }

    pub(super) fn run_in(
        &self,
        ws: &mut Workspace,
        batch: &GemmaBatch,
        keep: bool,
    ) -> CudaResult<Option<GemmaStages>> {
        let c = &self.base.cfg;
        let d = &*self.base.dev;
        let (n, h, heads, kd) = (batch.n, c.hidden, c.heads, self.base.kd);
        let (wp, mi, pd) = (heads * kd, c.intermediate, c.patch_dim());
        let eps = c.eps as f32;
        // bf16 and f16 (the 16-bit product modes) fuse the next pre-norm into the residual
        // kernel (a generic kernel: every tier, as the 8.0 tier does for bf16).
        let half_mode = match self.base.precision {
            Precision::Bf16 | Precision::F16 => true,
            Precision::F32 => false,
        };
        let mut stages = keep.then(GemmaStages::default);

        // Patch projection (input law folded into weight and bias) + position tables.
        d.gemm(
            GemmBuffer::inputs(&ws.inp.rows, &self.patch_w)?,
            Some(GemmBias::F32(&self.patch_b)),
            GemmOutput::F32(&mut ws.x),
            GemmShape::dense(n, h, pd),
            Epilogue::None,
        )?;
        d.pos_add_xy(&mut ws.x, n, h, &self.pos, c.pos_rows, &ws.inp.pos)?;
        if let Some(s) = stages.as_mut() {
            s.patch_embed = self.base.dev.download_prefix(&ws.x, n * h)?;
        }

        let attention = ws.inp.attention(
            (heads, c.head_dim, kd),
            (RopeLayout::Gemma4, &self.inv_freq),
            ATTENTION_SCALE,
            &batch.cu,
        );
        // In bf16 and f16 modes a single unclamped group reads the pre-norm fused into the
        // residual kernel.
        let fusable = |gs: &[Group]| half_mode && gs.len() == 1 && gs[0].clamp_in == Clamp::NONE;
        let mut prenormed = false;
        for (li, l) in self.layers.iter().enumerate() {
            // --- attention ---
            if !prenormed && fusable(&l.qkv) {
                self.norm_into(&ws.x, Some(&l.ln_in), &mut ws.hn, n, Clamp::NONE)?;
                prenormed = true;
            }
            self.grouped_gemm(
                &ws.x,
                &l.ln_in,
                &mut ws.hn,
                &l.qkv,
                &mut ws.qkv,
                3 * wp,
                n,
                prenormed,
            )?;
            // f16 range: q|k|v (the GEMM's output) round to f16, ±inf beyond ±65504. A clipped
            // linear's output clamp (`qkv_out`) then maps +inf to its bound, as f32 would map the
            // large value; but gpu-core's clamp (`fminf(fmaxf(x, lo), hi)`) maps a NaN to `lo`,
            // so a NaN born of an inf upstream is hidden there and at `o_in` below. The rows'
            // finiteness check (gpu-core `DeviceTower::rows`) catches every inf that reaches them
            // unclamped; the GPU parity rows (bound 2e-2 against the oracle) catch a hidden one.
            d.qkv_attention(
                &mut ws.qkv,
                &mut ws.attn,
                &attention,
                &QkNorm {
                    norm: [true; 3],
                    clamps: l.qkv_out,
                    ..QkNorm::weighted(&l.q_norm, &l.k_norm, eps)
                },
            )?;
            // o_proj's input clamp (f16 range: a NaN in the attention output becomes `lo` here;
            // see the note above).
            if l.o_in != Clamp::NONE {
                let m = Mat::dense(n, wp);
                d.act_in_place_mixed(&mut ws.attn, m, Activation::Identity, l.o_in, Clamp::NONE)?;
            }
            d.gemm(
                GemmBuffer::inputs(&ws.attn, &l.o)?,
                None,
                GemmOutput::F32(&mut ws.y),
                GemmShape::dense(n, h, wp),
                Epilogue::None,
            )?;
            let fuse_ffn = match &l.mlp {
                Mlp::Joint { clamp_in, .. } => half_mode && *clamp_in == Clamp::NONE,
                Mlp::Split { .. } => false,
            };
            {
                let next = fuse_ffn.then_some((Some(&l.ln_pre_ffn), &mut ws.hn, eps));
                d.residual_rms_add_mixed(
                    &mut ws.x,
                    &ws.y,
                    Mat::dense(n, h),
                    Some(&l.ln_post_attn),
                    eps,
                    l.o_out,
                    next,
                )?;
            }
            // --- MLP ---
            match &l.mlp {
                Mlp::Joint { gate_up, clamp_in } => {
                    if !fuse_ffn {
                        self.norm_into(&ws.x, Some(&l.ln_pre_ffn), &mut ws.hn, n, *clamp_in)?;
                    }
                    // f16 range: gate|up round to f16 before the gate (±inf beyond ±65504),
                    // and the gated product (the down projection's input) is f16 too.
                    gate_up.run(d, &ws.hn, n, ws.gu.as_mut(), &mut ws.act)?;
                }
                Mlp::Split { groups, gate } => {
                    let Some(gu) = ws.gu.as_mut() else {
                        return Err(CudaError::Unsupported("no gate|up workspace".into()));
                    };
                    self.grouped_gemm(
                        &ws.x,
                        &l.ln_pre_ffn,
                        &mut ws.hn,
                        groups,
                        gu,
                        2 * mi,
                        n,
                        false,
                    )?;
                    let gate_m = Mat::strided(n, mi, 2 * mi, 0);
                    let up_m = Mat::strided(n, mi, 2 * mi, mi);
                    d.gated_act_mixed(&mut ws.act, Mat::dense(n, mi), gu, gate_m, gu, up_m, *gate)?;
                }
            }
            d.gemm(
                GemmBuffer::inputs(&ws.act, &l.down)?,
                None,
                GemmOutput::F32(&mut ws.y),
                GemmShape::dense(n, h, mi),
                Epilogue::None,
            )?;
            {
                // The next layer's pre-norm, fused here when that layer reads it unclamped
                // (none after the last layer).
                let next = self
                    .layers
                    .get(li + 1)
                    .filter(|nx| fusable(&nx.qkv))
                    .map(|nx| (Some(&nx.ln_in), &mut ws.hn, eps));
                prenormed = next.is_some();
                d.residual_rms_add_mixed(
                    &mut ws.x,
                    &ws.y,
                    Mat::dense(n, h),
                    Some(&l.ln_post_ffn),
                    eps,
                    l.down_out,
                    next,
                )?;
            }
            if let (Some(s), 0) = (stages.as_mut(), li) {
                s.block_0 = self.base.dev.download_prefix(&ws.x, n * h)?;
            }
        }
        if let Some(s) = stages.as_mut() {
            s.blocks_out = self.base.dev.download_prefix(&ws.x, n * h)?;
        }

        // transformers Gemma4VisionPooler: k×k average by position, then × sqrt(H) in f32.
        self.pool(ws, batch)?;
        let np = batch.rows();
        if let Some(s) = stages.as_mut() {
            s.pooled = self.base.dev.download_prefix(&ws.pooled, np * h)?;
        }
        // Standardisation `(p − b)·s` = `p·diag(s) + (−b·s)` as one f32 GEMM.
        let std_buf = match &self.std {
            Some((diag, nb)) => {
                d.gemm(
                    GemmInputs::F32 {
                        x: &ws.pooled,
                        w: diag,
                    },
                    Some(GemmBias::F32(nb)),
                    GemmOutput::F32(&mut ws.std),
                    GemmShape::dense(np, h, h),
                    Epilogue::None,
                )?;
                &ws.std
            }
            None => &ws.pooled,
        };
        if let Some(s) = stages.as_mut() {
            s.standardized = self.base.dev.download_prefix(std_buf, np * h)?;
        }
        // Gemma4MultimodalEmbedder: weightless RMSNorm; its projection to the LM width follows
        // in `project`.
        let m = Mat::dense(np, h);
        // f16 range: normed rows are O(1) per element (weightless RMSNorm), far inside f16's range.
        d.rms_norm_mixed(std_buf, m, None, &mut ws.normed, m, eps, Clamp::NONE)?;
        Ok(stages)
    }

    /// Pools every image of `ws.x` into `ws.pooled` (rows concatenated in image order). Consecutive
    /// images of one width pool as one taller grid (k divides every height, so no window crosses
    /// an image); a run that does not start at row 0 is copied through exact identity GEMMs first,
    /// via `ws.y` and `ws.std` (both free at this point), so nothing is allocated.
    pub(super) fn pool(&self, ws: &mut Workspace, batch: &GemmaBatch) -> CudaResult<()> {
        let (c, d) = (&self.base.cfg, &*self.base.dev);
        let (h, k) = (c.hidden, c.pool);
        let root_h = (h as f64).sqrt() as f32;
        let mut i = 0;
        let (mut tok, mut prow) = (0usize, 0usize);
        while i < batch.grids.len() {
            let gw = batch.grids[i].0;
            let mut j = i;
            let mut gh_sum = 0;
            while j < batch.grids.len() && batch.grids[j].0 == gw {
                gh_sum += batch.grids[j].1;
                j += 1;
            }
            let (nt, npr) = (gw * gh_sum, (gw / k) * (gh_sum / k));
            if tok == 0 {
                d.avg_pool(&ws.x, gh_sum, gw, k, h, root_h, &mut ws.pooled)?;
            } else {
                let copy = |x: &DeviceBuffer<f32>, y: &mut DeviceBuffer<f32>, rows, xo, yo| {
                    d.gemm(
                        GemmInputs::F32 { x, w: &self.eye_h },
                        None,
                        GemmOutput::F32(y),
                        GemmShape {
                            x_offset: xo,
                            y_offset: yo,
                            ..GemmShape::dense(rows, h, h)
                        },
                        Epilogue::None,
                    )
                };
                copy(&ws.x, &mut ws.y, nt, tok * h, 0)?;
                d.avg_pool(&ws.y, gh_sum, gw, k, h, root_h, &mut ws.std)?;
                copy(&ws.std, &mut ws.pooled, npr, 0, prow * h)?;
            }
            tok += nt;
            prow += npr;
            i = j;
        }
        Ok(())
    }
}
