//! The forward op sequence on the device, the same as [`crate::forward_host`]: patch embedding,
//! the encoder layers, the two stride-2 downsamplers (im2col + GEMM), with the stage
//! activations downloaded on request.

use super::*;

impl StepCuda {
    pub(super) fn run_in(
        &self,
        ws: &mut Workspace,
        batch: &StepBatch,
        keep: bool,
    ) -> CudaResult<Option<HostStages>> {
        let (c, b) = (&self.base.cfg, &batch.plan);
        let d = &*self.base.dev;
        let (n, h, wp, inner) = (b.n, c.hidden, c.heads * self.base.kd, c.intermediate);
        let eps = c.eps as f32;
        let hm = Mat::dense(n, h);
        let acc = |m, nn, k| GemmShape {
            accumulate: true,
            ..GemmShape::dense(m, nn, k)
        };
        let mut host = keep.then(HostStages::default);

        // Each view's position table (as is, or bilinear to its grid), then the patch conv (no
        // bias) accumulated onto it: embeddings + pos (modeling_step3p7.py:329-339).
        for v in &b.views {
            let rows = v.tokens();
            d.act(
                &mut ws.y,
                Mat::strided(rows, h, h, v.tok * h),
                self.table(v.gh, v.gw)?,
                Mat::dense(rows, h),
                Activation::Identity,
                Clamp::NONE,
                Clamp::NONE,
            )?;
        }
        d.gemm(
            GemmBuffer::inputs(&ws.inp.rows, &self.patch)?,
            None,
            GemmOutput::F32(&mut ws.y),
            acc(n, h, patch_k(c)),
            Epilogue::None,
        )?;
        if let Some(s) = host.as_mut() {
            s.patch_embed = self.base.dev.download_prefix(&ws.y, n * h)?;
        }
        d.layer_norm(
            &ws.y,
            hm,
            Some(&self.ln_pre_w),
            Some(&self.ln_pre_b),
            &mut ws.x,
            hm,
            eps,
        )?;
        if let Some(s) = host.as_mut() {
            s.pre_ln = self.base.dev.download_prefix(&ws.x, n * h)?;
        }

        let attention = ws.inp.attention(
            (c.heads, c.head_dim, self.base.kd),
            (self.rope, &self.inv_freq),
            attention_scale(c.head_dim),
            &batch.cu,
        );
        for (li, l) in self.layers.iter().enumerate() {
            // x += λ1 ⊙ out_proj(attn(LN1(x)))   (λ1 folded into out_proj)
            d.layer_norm_mixed(
                &ws.x,
                hm,
                Some(&l.ln1_w),
                Some(&l.ln1_b),
                &mut ws.hn,
                hm,
                eps,
            )?;
            d.gemm(
                GemmBuffer::inputs(&ws.hn, &l.qkv)?,
                Some(l.qkv_b.bias()),
                ws.qkv.out(),
                GemmShape::dense(n, 3 * wp, h),
                Epilogue::None,
            )?;
            d.qkv_attention(&mut ws.qkv, &mut ws.attn, &attention, &QkNorm::none(eps))?;
            d.gemm(
                GemmBuffer::inputs(&ws.attn, &l.out)?,
                Some(GemmBias::F32(&l.out_b)),
                GemmOutput::F32(&mut ws.x),
                acc(n, h, wp),
                Epilogue::None,
            )?;
            // x += λ2 ⊙ fc2(quick_gelu(fc1(LN2(x))))   (λ2 folded into fc2)
            d.layer_norm_mixed(
                &ws.x,
                hm,
                Some(&l.ln2_w),
                Some(&l.ln2_b),
                &mut ws.hn,
                hm,
                eps,
            )?;
            l.fc1.run(d, &ws.hn, n, None, &mut ws.f)?;
            d.gemm(
                GemmBuffer::inputs(&ws.f, &l.fc2)?,
                Some(GemmBias::F32(&l.fc2_b)),
                GemmOutput::F32(&mut ws.x),
                acc(n, h, inner),
                Epilogue::None,
            )?;
            if let (Some(s), 0) = (host.as_mut(), li) {
                s.block_0 = self.base.dev.download_prefix(&ws.x, n * h)?;
            }
        }
        if let Some(s) = host.as_mut() {
            s.blocks_out = self.base.dev.download_prefix(&ws.x, n * h)?;
            s.d1 = vec![0.0; b.n1 * 2 * h];
        }

        // No post-LN; per grid size the two 3×3 stride-2 pad-1 convs with bias as im2col + GEMM
        // (modeling_step3p7.py:430-434), then the projector over every view (:958-960).
        // f16 range: the residual stream is cast for the convolutions' im2col; a value beyond
        // ±65504 becomes ±inf there, and the rows' finiteness check refuses the pass.
        match &mut ws.hn {
            GemmBuffer::Bf16(xb) => d.cast_f32_half(&ws.x, xb)?,
            GemmBuffer::F16(xb) => d.cast_f32_half(&ws.x, xb)?,
            GemmBuffer::F32(_) => {}
        }
        for r in &b.runs {
            let v0 = b.views[r.first];
            let (h1, w1) = (conv3x3s2_out(r.gh), conv3x3s2_out(r.gw));
            let (h2, w2) = (conv3x3s2_out(h1), conv3x3s2_out(w1));
            let (m1, m2) = (r.views * h1 * w1, r.views * h2 * w2);
            match (&mut ws.hn, &mut ws.attn, &mut ws.col1) {
                (GemmBuffer::Bf16(xb), GemmBuffer::Bf16(moved), GemmBuffer::Bf16(col)) => {
                    im2col_half(d, xb, moved, col, r.views, r.gh, r.gw, h, v0.tok)?
                }
                (GemmBuffer::F16(xb), GemmBuffer::F16(moved), GemmBuffer::F16(col)) => {
                    im2col_half(d, xb, moved, col, r.views, r.gh, r.gw, h, v0.tok)?
                }
                (_, _, GemmBuffer::F32(col)) => {
                    let plan = im2col_plan(r.views, r.gh, r.gw, h, v0.tok);
                    self.im2col_f32(&ws.x, col, ws.zeros.as_ref(), h, &plan)?;
                }
                _ => return Err(CudaError::Unsupported("mixed-precision workspace".into())),
            }
            d.gemm(
                GemmBuffer::inputs(&ws.col1, &self.down1)?,
                Some(self.down1_b.bias()),
                ws.d1.out(),
                GemmShape::dense(m1, 2 * h, CONV_TAPS * h),
                Epilogue::None,
            )?;
            if let Some(s) = host.as_mut() {
                let (a, z) = (v0.r1 * 2 * h, (v0.r1 + m1) * 2 * h);
                s.d1[a..z].copy_from_slice(&ws.d1.download_f32(d, z - a)?);
            }
            match (&ws.d1, &mut ws.col2) {
                (GemmBuffer::Bf16(d1), GemmBuffer::Bf16(col)) => {
                    d.im2col_3x3s2(d1, r.views, h1, w1, 2 * h, col)?
                }
                (GemmBuffer::F16(d1), GemmBuffer::F16(col)) => {
                    d.im2col_3x3s2(d1, r.views, h1, w1, 2 * h, col)?
                }
                (GemmBuffer::F32(d1), GemmBuffer::F32(col)) => {
                    let plan = im2col_plan(r.views, h1, w1, 2 * h, 0);
                    self.im2col_f32(d1, col, ws.zeros.as_ref(), 2 * h, &plan)?;
                }
                _ => return Err(CudaError::Unsupported("mixed-precision workspace".into())),
            }
            d.gemm(
                GemmBuffer::inputs(&ws.col2, &self.down2)?,
                Some(self.down2_b.bias()),
                ws.d2.out(),
                GemmShape {
                    y_offset: v0.r2 * c.out_width(),
                    ..GemmShape::dense(m2, c.out_width(), CONV_TAPS * 2 * h)
                },
                Epilogue::None,
            )?;
        }
        // The projector follows in `project`.
        let Some(mut s) = host else {
            return Ok(None);
        };
        s.d2 = ws.d2.download_f32(d, b.n2 * c.out_width())?;
        Ok(Some(s))
    }

    /// The f32 im2col of `plan` from `src` into `col` (strided copies; padding from `zeros`).
    pub(super) fn im2col_f32(
        &self,
        src: &DeviceBuffer<f32>,
        col: &mut DeviceBuffer<f32>,
        zeros: Option<&DeviceBuffer<f32>>,
        c: usize,
        plan: &[ColCopy],
    ) -> CudaResult<()> {
        let zeros =
            zeros.ok_or_else(|| CudaError::Unsupported("f32 im2col without zeros".into()))?;
        for p in plan {
            let dst = Mat::strided(p.rows, c, CONV_TAPS * c, p.dst);
            let (buf, m) = match p.src {
                Some((off, ld)) => (src, Mat::strided(p.rows, c, ld, off)),
                None => (zeros, Mat::dense(p.rows, c)),
            };
            self.base.dev.act(
                col,
                dst,
                buf,
                m,
                Activation::Identity,
                Clamp::NONE,
                Clamp::NONE,
            )?;
        }
        Ok(())
    }
}

/// The 16-bit (bf16 or f16) im2col of one grid-size run: its views' rows of `xb` (the residual
/// stream cast to the GEMM precision), moved to the start of `moved` first when the run does not
/// start at token 0, through gpu-core's `im2col_3x3s2` into `col`.
#[allow(clippy::too_many_arguments)]
fn im2col_half<T: HalfElem>(
    d: &Device,
    xb: &DeviceBuffer<T>,
    moved: &mut DeviceBuffer<T>,
    col: &mut DeviceBuffer<T>,
    views: usize,
    gh: usize,
    gw: usize,
    h: usize,
    tok: usize,
) -> CudaResult<()> {
    let rows = views * gh * gw;
    let src = if tok == 0 {
        xb
    } else {
        d.act(
            moved,
            Mat::dense(rows, h),
            xb,
            Mat::strided(rows, h, h, tok * h),
            Activation::Identity,
            Clamp::NONE,
            Clamp::NONE,
        )?;
        &*moved
    };
    d.im2col_3x3s2(src, views, gh, gw, h, col)?;
    Ok(())
}
