//! The forward op sequence on the device (`run_in`, the same ops as [`crate::forward_host`])
//! and its helpers; the tower's upload, staging, graphs and workspace are in `mod.rs`.

use super::*;

impl GlmCuda {
    /// RMSNorm of `x` rows into `hn`, in the GEMM precision.
    pub(super) fn norm_into(
        &self,
        x: &DeviceBuffer<f32>,
        w: &DeviceBuffer<f32>,
        hn: &mut GemmBuffer,
        rows: usize,
    ) -> CudaResult<()> {
        let m = Mat::dense(rows, self.base.cfg.hidden);
        let eps = self.base.cfg.eps as f32;
        Ok(self
            .base
            .dev
            .rms_norm_mixed(x, m, Some(w), hn, m, eps, Clamp::NONE)?)
    }

    pub(super) fn run_in(
        &self,
        ws: &mut Workspace,
        batch: &GlmBatch,
        keep: bool,
    ) -> CudaResult<Option<GlmStages>> {
        let c = &self.base.cfg;
        let d = &*self.base.dev;
        let (n, h, kd) = (batch.n, c.hidden, self.base.kd);
        let (wp, mi, pd) = (c.heads * kd, c.intermediate, c.patch_dim());
        let (o, u) = (c.text_hidden, c.merge_unit());
        let np = batch.rows();
        let eps = c.eps as f32;
        let mut stages = keep.then(GlmStages::default);
        let acc = |m, nn, k| GemmShape {
            accumulate: true,
            ..GemmShape::dense(m, nn, k)
        };

        // Conv3d patch embedding (kernel = stride) ≡ a GEMM over the pixel rows, with bias.
        d.gemm(
            GemmBuffer::inputs(&ws.inp.rows, &self.patch_w)?,
            Some(GemmBias::F32(&self.patch_b)),
            GemmOutput::F32(&mut ws.x),
            GemmShape::dense(n, h, pd),
            Epilogue::None,
        )?;
        if let Some(s) = stages.as_mut() {
            s.patch_embed = self.base.dev.download_prefix(&ws.x, n * h)?;
        }

        let attention = ws.inp.attention(
            (c.heads, c.head_dim, kd),
            (RopeLayout::Glm, &self.inv_freq),
            attention_scale(c.head_dim),
            &batch.cu,
        );
        for (li, b) in self.blocks.iter().enumerate() {
            // x += proj(attn(RMS(x)·norm1)) + b
            self.norm_into(&ws.x, &b.norm1, &mut ws.hn, n)?;
            d.gemm(
                GemmBuffer::inputs(&ws.hn, &b.qkv)?,
                out_bias(&b.qkv_b),
                ws.qkv.out(),
                GemmShape::dense(n, 3 * wp, h),
                Epilogue::None,
            )?;
            d.qkv_attention(
                &mut ws.qkv,
                &mut ws.attn,
                &attention,
                &QkNorm::weighted(&b.q_norm, &b.k_norm, eps),
            )?;
            d.gemm(
                GemmBuffer::inputs(&ws.attn, &b.proj)?,
                bias(&b.proj_b),
                GemmOutput::F32(&mut ws.x),
                acc(n, h, wp),
                Epilogue::None,
            )?;
            // x += down(swiglu(gate|up(RMS(x)·norm2))) + b
            self.norm_into(&ws.x, &b.norm2, &mut ws.hn, n)?;
            b.gate_up.run(d, &ws.hn, n, ws.gu.as_mut(), &mut ws.act)?;
            d.gemm(
                GemmBuffer::inputs(&ws.act, &b.down)?,
                bias(&b.down_b),
                GemmOutput::F32(&mut ws.x),
                acc(n, h, mi),
                Epilogue::None,
            )?;
            if let (Some(s), 0) = (stages.as_mut(), li) {
                s.block_0 = self.base.dev.download_prefix(&ws.x, n * h)?;
            }
        }
        if let Some(s) = stages.as_mut() {
            s.blocks_out = self.base.dev.download_prefix(&ws.x, n * h)?;
        }

        // post_layernorm, then the m×m stride-m conv as one GEMM over [N/m², m²H] (module docs).
        self.norm_into(&ws.x, &self.post_norm, &mut ws.hn, n)?;
        if let (Some(s), Some(st)) = (stages.as_mut(), ws.stage.as_mut()) {
            let m = Mat::dense(n, h);
            d.rms_norm(&ws.x, m, Some(&self.post_norm), st, m, eps, Clamp::NONE)?;
            s.post_norm = self.base.dev.download_prefix(st, n * h)?;
        }
        d.gemm(
            GemmBuffer::inputs(&ws.hn, &self.ds_w)?,
            bias(&self.ds_b),
            GemmOutput::F32(&mut ws.ds),
            GemmShape::dense(np, o, u * h),
            Epilogue::None,
        )?;
        if let Some(s) = stages.as_mut() {
            s.downsample = self.base.dev.download_prefix(&ws.ds, np * o)?;
        }
        // Merger: proj → LayerNorm(eps 1e-5) → erf GELU → gate|up → SwiGLU → down.
        // f16 range: the downsample output (f32) is cast for the merger's first GEMM; a value
        // beyond ±65504 becomes ±inf there, and the rows' finiteness check refuses the pass.
        let proj_in = match (&mut ws.ds_b, &self.m_proj) {
            (Some(GemmBuffer::Bf16(xb)), GemmBuffer::Bf16(w)) => {
                d.cast_f32_half(&ws.ds, xb)?;
                GemmInputs::Bf16 { x: &*xb, w }
            }
            (Some(GemmBuffer::F16(xb)), GemmBuffer::F16(w)) => {
                d.cast_f32_half(&ws.ds, xb)?;
                GemmInputs::F16 { x: &*xb, w }
            }
            (None, GemmBuffer::F32(w)) => GemmInputs::F32 { x: &ws.ds, w },
            _ => return Err(CudaError::Unsupported("mixed-precision workspace".into())),
        };
        d.gemm(
            proj_in,
            bias(&self.m_proj_b),
            GemmOutput::F32(&mut ws.m),
            GemmShape::dense(np, o, o),
            Epilogue::None,
        )?;
        let mm = Mat::dense(np, o);
        let leps = MERGER_LAYER_NORM_EPS as f32;
        let (lw, lb) = (Some(&self.m_norm_w), Some(&self.m_norm_b));
        d.layer_norm_mixed(&ws.m, mm, lw, lb, &mut ws.mn, mm, leps)?;
        d.act_in_place_mixed(
            &mut ws.mn,
            mm,
            Activation::GeluErf,
            Clamp::NONE,
            Clamp::NONE,
        )?;
        self.m_gate_up
            .run(d, &ws.mn, np, ws.mgu.as_mut(), &mut ws.mact)?;
        // The down projection to the LM width follows in `project`.
        Ok(stages)
    }
}
