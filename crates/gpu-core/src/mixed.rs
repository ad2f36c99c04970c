//! The precisions the towers' CUDA paths run in, and the buffers, GEMM operands and
//! launches that follow one precision through a whole forward pass.
//!
//! A tower picks a [`Precision`] once: its linear weights and every activation buffer that
//! feeds a GEMM (pre-norms, fused qkv, attention output, MLP activations) are then
//! [`GemmBuffer`]s of that precision — bf16 on the tensor cores in the product mode, f16 (the
//! same places in IEEE half: Turing's precision, on every tier), f32 in the exactness mode, where
//! nothing on the path rounds. The residual stream, norms and
//! biases of f32 outputs stay f32 in both. The `*_mixed` methods on [`Device`] dispatch the
//! activation-side kernels on the buffer's precision, so tower code is written once.
//!
//! Head padding: the bf16 and f16 attention kernels exist for [`BF16_ATTN_HEAD_DIMS`] only; a tower with
//! another head dim runs at the next one, with zero q/k/v weight rows ([`pad_head_rows`]) and
//! zero output-projection columns ([`pad_head_cols`]), so the padded lanes contribute exact zeros.
use half::{bf16, f16};
use rayon::prelude::*;

use crate::{
    Activation, Clamp, Device, DeviceBuffer, Gate, GemmBias, GemmInputs, GemmOutput, GpuError, Mat,
    Precision, Result, MAX_F32_ATTN_HEAD_DIM,
};

/// Head dims the bf16 tensor-core flash-attention kernels exist for (`flash_attn_hd*_bf16`).
pub const BF16_ATTN_HEAD_DIMS: [usize; 3] = [64, 72, 96];

/// Head dims the f16 flash-attention kernels exist for (`flash_attn_hd*_f16` and Turing's
/// `flash_attn_sm75_hd*_f16`): the bf16 kernels' twins.
pub const F16_ATTN_HEAD_DIMS: [usize; 3] = BF16_ATTN_HEAD_DIMS;

/// The head dim attention runs at for a model head dim `hd` in precision `p`: f32 runs `hd`
/// itself (up to [`MAX_F32_ATTN_HEAD_DIM`]); bf16 the smallest of [`BF16_ATTN_HEAD_DIMS`] that
/// holds it, f16 the smallest of [`F16_ATTN_HEAD_DIMS`].
pub fn attention_head_dim(p: Precision, hd: usize) -> Result<usize> {
    let refuse = |what: String| GpuError::Shape {
        op: "attention_head_dim",
        what,
    };
    match p {
        Precision::F32 if (1..=MAX_F32_ATTN_HEAD_DIM).contains(&hd) => Ok(hd),
        Precision::F32 => Err(refuse(format!(
            "head_dim {hd}: the f32 attention kernel takes 1..={MAX_F32_ATTN_HEAD_DIM}"
        ))),
        Precision::Bf16 | Precision::F16 => {
            let dims = match p {
                Precision::F16 => F16_ATTN_HEAD_DIMS,
                Precision::Bf16 | Precision::F32 => BF16_ATTN_HEAD_DIMS,
            };
            dims.iter()
                .copied()
                .find(|&k| k >= hd && hd > 0)
                .ok_or_else(|| {
                    refuse(format!(
                        "head_dim {hd}: the {p} attention kernels stop at {}",
                        dims[dims.len() - 1]
                    ))
                })
        }
    }
}

/// A device matrix in a tower's GEMM precision (see the module docs).
#[derive(Debug)]
pub enum GemmBuffer {
    /// The product mode's bf16.
    Bf16(DeviceBuffer<bf16>),
    /// f16 (IEEE half), the product mode of tiers without bf16.
    F16(DeviceBuffer<f16>),
    /// The exactness mode's f32.
    F32(DeviceBuffer<f32>),
}

fn mixed(op: &'static str) -> GpuError {
    GpuError::Shape {
        op,
        what: "buffers of different precisions".into(),
    }
}

impl GemmBuffer {
    /// Allocates `len` elements of unspecified contents in precision `p`.
    pub fn alloc(dev: &Device, p: Precision, len: usize) -> Result<GemmBuffer> {
        Ok(match p {
            Precision::Bf16 => GemmBuffer::Bf16(dev.alloc(len)?),
            Precision::F16 => GemmBuffer::F16(dev.alloc(len)?),
            Precision::F32 => GemmBuffer::F32(dev.alloc(len)?),
        })
    }

    /// Uploads f32 host values in precision `p` (bf16 and f16: rounded to nearest even, in
    /// parallel; an f32 beyond f16's range becomes an infinity, which the towers' finite-rows
    /// check then reports).
    pub fn upload(dev: &Device, p: Precision, host: &[f32]) -> Result<GemmBuffer> {
        Ok(match p {
            Precision::Bf16 => {
                let v: Vec<bf16> = host.par_iter().map(|&x| bf16::from_f32(x)).collect();
                GemmBuffer::Bf16(dev.upload(&v)?)
            }
            Precision::F16 => {
                let v: Vec<f16> = host.par_iter().map(|&x| f16::from_f32(x)).collect();
                GemmBuffer::F16(dev.upload(&v)?)
            }
            Precision::F32 => GemmBuffer::F32(dev.upload(host)?),
        })
    }

    /// [`GemmBuffer::upload`] of an optional tensor (e.g. a bias some checkpoints lack).
    pub fn upload_opt(
        dev: &Device,
        p: Precision,
        host: Option<&[f32]>,
    ) -> Result<Option<GemmBuffer>> {
        host.map(|h| GemmBuffer::upload(dev, p, h)).transpose()
    }

    /// The buffer's precision.
    pub fn precision(&self) -> Precision {
        match self {
            GemmBuffer::Bf16(_) => Precision::Bf16,
            GemmBuffer::F16(_) => Precision::F16,
            GemmBuffer::F32(_) => Precision::F32,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            GemmBuffer::Bf16(b) => b.len(),
            GemmBuffer::F16(b) => b.len(),
            GemmBuffer::F32(b) => b.len(),
        }
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes on the device.
    pub fn bytes(&self) -> usize {
        match self {
            GemmBuffer::Bf16(b) => 2 * b.len(),
            GemmBuffer::F16(b) => 2 * b.len(),
            GemmBuffer::F32(b) => 4 * b.len(),
        }
    }

    /// This buffer as a GEMM output.
    pub fn out(&mut self) -> GemmOutput<'_> {
        match self {
            GemmBuffer::Bf16(b) => GemmOutput::Bf16(b),
            GemmBuffer::F16(b) => GemmOutput::F16(b),
            GemmBuffer::F32(b) => GemmOutput::F32(b),
        }
    }

    /// This buffer as a GEMM bias. A GEMM whose output is in the GEMM precision takes its bias
    /// in that precision: an f32 bias on a bf16 output gave `CUBLAS_STATUS_INVALID_VALUE` on the
    /// H200 (docs/notes/glm-cuda.md); GEMMs into f32 outputs take f32 biases.
    pub fn bias(&self) -> GemmBias<'_> {
        match self {
            GemmBuffer::Bf16(b) => GemmBias::Bf16(b),
            GemmBuffer::F16(b) => GemmBias::F16(b),
            GemmBuffer::F32(b) => GemmBias::F32(b),
        }
    }

    /// The GEMM operands `x·wᵀ`; both must be in one precision.
    pub fn inputs<'a>(x: &'a GemmBuffer, w: &'a GemmBuffer) -> Result<GemmInputs<'a>> {
        match (x, w) {
            (GemmBuffer::Bf16(x), GemmBuffer::Bf16(w)) => Ok(GemmInputs::Bf16 { x, w }),
            (GemmBuffer::F16(x), GemmBuffer::F16(w)) => Ok(GemmInputs::F16 { x, w }),
            (GemmBuffer::F32(x), GemmBuffer::F32(w)) => Ok(GemmInputs::F32 { x, w }),
            _ => Err(mixed("gemm")),
        }
    }

    /// Copies the first `len` elements back to the host as f32 (synchronises).
    pub fn download_f32(&self, dev: &Device, len: usize) -> Result<Vec<f32>> {
        Ok(match self {
            GemmBuffer::Bf16(b) => dev
                .download_prefix(b, len)?
                .into_iter()
                .map(bf16::to_f32)
                .collect(),
            GemmBuffer::F16(b) => dev
                .download_prefix(b, len)?
                .into_iter()
                .map(f16::to_f32)
                .collect(),
            GemmBuffer::F32(b) => dev.download_prefix(b, len)?,
        })
    }
}

impl Device {
    /// [`Device::rms_norm`] into a buffer of either precision.
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm_mixed(
        &self,
        x: &DeviceBuffer<f32>,
        xm: Mat,
        w: Option<&DeviceBuffer<f32>>,
        y: &mut GemmBuffer,
        ym: Mat,
        eps: f32,
        clamp: Clamp,
    ) -> Result<()> {
        match y {
            GemmBuffer::Bf16(y) => self.rms_norm(x, xm, w, y, ym, eps, clamp),
            GemmBuffer::F16(y) => self.rms_norm(x, xm, w, y, ym, eps, clamp),
            GemmBuffer::F32(y) => self.rms_norm(x, xm, w, y, ym, eps, clamp),
        }
    }

    /// [`Device::layer_norm`] into a buffer of either precision.
    #[allow(clippy::too_many_arguments)]
    pub fn layer_norm_mixed(
        &self,
        x: &DeviceBuffer<f32>,
        xm: Mat,
        w: Option<&DeviceBuffer<f32>>,
        b: Option<&DeviceBuffer<f32>>,
        y: &mut GemmBuffer,
        ym: Mat,
        eps: f32,
    ) -> Result<()> {
        match y {
            GemmBuffer::Bf16(y) => self.layer_norm(x, xm, w, b, y, ym, eps),
            GemmBuffer::F16(y) => self.layer_norm(x, xm, w, b, y, ym, eps),
            GemmBuffer::F32(y) => self.layer_norm(x, xm, w, b, y, ym, eps),
        }
    }

    /// [`Device::gated_act`] on buffers of one precision (gate and up may be one buffer).
    #[allow(clippy::too_many_arguments)]
    pub fn gated_act_mixed(
        &self,
        out: &mut GemmBuffer,
        om: Mat,
        gate: &GemmBuffer,
        gm: Mat,
        up: &GemmBuffer,
        um: Mat,
        g: Gate,
    ) -> Result<()> {
        match (out, gate, up) {
            (GemmBuffer::Bf16(o), GemmBuffer::Bf16(ga), GemmBuffer::Bf16(u)) => {
                self.gated_act(o, om, ga, gm, u, um, g)
            }
            (GemmBuffer::F16(o), GemmBuffer::F16(ga), GemmBuffer::F16(u)) => {
                self.gated_act(o, om, ga, gm, u, um, g)
            }
            (GemmBuffer::F32(o), GemmBuffer::F32(ga), GemmBuffer::F32(u)) => {
                self.gated_act(o, om, ga, gm, u, um, g)
            }
            _ => Err(mixed("gated_act")),
        }
    }

    /// [`Device::act`] (a strided copy with [`Activation::Identity`]) on buffers of one precision.
    #[allow(clippy::too_many_arguments)]
    pub fn act_mixed(
        &self,
        out: &mut GemmBuffer,
        om: Mat,
        x: &GemmBuffer,
        xm: Mat,
        act: Activation,
        input: Clamp,
        output: Clamp,
    ) -> Result<()> {
        match (out, x) {
            (GemmBuffer::Bf16(o), GemmBuffer::Bf16(x)) => {
                self.act(o, om, x, xm, act, input, output)
            }
            (GemmBuffer::F16(o), GemmBuffer::F16(x)) => self.act(o, om, x, xm, act, input, output),
            (GemmBuffer::F32(o), GemmBuffer::F32(x)) => self.act(o, om, x, xm, act, input, output),
            _ => Err(mixed("act")),
        }
    }

    /// [`Device::residual_rms_add`] with the next pre-norm (when `next` is given) into a 16-bit
    /// buffer: bf16 or f16 ([`Device::residual_rms_add_f16`]); an f32 buffer takes no fused
    /// next pre-norm (the exactness mode norms on its own), and is refused.
    #[allow(clippy::too_many_arguments)]
    pub fn residual_rms_add_mixed(
        &self,
        x: &mut DeviceBuffer<f32>,
        y: &DeviceBuffer<f32>,
        ym: Mat,
        w_post: Option<&DeviceBuffer<f32>>,
        eps: f32,
        clamp: Clamp,
        next: Option<(Option<&DeviceBuffer<f32>>, &mut GemmBuffer, f32)>,
    ) -> Result<()> {
        match next {
            None => self.residual_rms_add(x, y, ym, w_post, eps, clamp, None),
            Some((w, GemmBuffer::Bf16(out), e)) => {
                self.residual_rms_add(x, y, ym, w_post, eps, clamp, Some((w, out, e)))
            }
            Some((w, GemmBuffer::F16(out), e)) => {
                self.residual_rms_add_f16(x, y, ym, w_post, eps, clamp, Some((w, out, e)))
            }
            Some((_, GemmBuffer::F32(_), _)) => Err(GpuError::Shape {
                op: "residual_rms_add",
                what: "the fused next pre-norm writes bf16 or f16, not f32".into(),
            }),
        }
    }

    /// [`Device::act_in_place`] on a buffer of either precision.
    pub fn act_in_place_mixed(
        &self,
        x: &mut GemmBuffer,
        xm: Mat,
        act: Activation,
        input: Clamp,
        output: Clamp,
    ) -> Result<()> {
        match x {
            GemmBuffer::Bf16(x) => self.act_in_place(x, xm, act, input, output),
            GemmBuffer::F16(x) => self.act_in_place(x, xm, act, input, output),
            GemmBuffer::F32(x) => self.act_in_place(x, xm, act, input, output),
        }
    }
}

/// Rows of `[heads·hd, inp]` (a bias is `inp = 1`) spread to `[heads·kd, inp]`, zero rows in the
/// padding of each head.
pub fn pad_head_rows(w: &[f32], inp: usize, heads: usize, hd: usize, kd: usize) -> Vec<f32> {
    if hd == kd {
        return w.to_vec();
    }
    let mut out = vec![0.0f32; heads * kd * inp];
    for head in 0..heads {
        let src = head * hd * inp;
        let dst = head * kd * inp;
        out[dst..dst + hd * inp].copy_from_slice(&w[src..src + hd * inp]);
    }
    out
}

/// `[rows, heads·hd]` spread to `[rows, heads·kd]`, zero columns in the padding of each head.
pub fn pad_head_cols(w: &[f32], rows: usize, heads: usize, hd: usize, kd: usize) -> Vec<f32> {
    if hd == kd {
        return w.to_vec();
    }
    let (inp, wp) = (heads * hd, heads * kd);
    let mut out = vec![0.0f32; rows * wp];
    for j in 0..rows {
        for head in 0..heads {
            let src = j * inp + head * hd;
            let dst = j * wp + head * kd;
            out[dst..dst + hd].copy_from_slice(&w[src..src + hd]);
        }
    }
    out
}

/// The per-head launches of a q/k norm + rope over heads padded from `hd` to `kd`: one
/// `(column offset, heads)` group covering every head when nothing is padded, else one group per
/// head (the kernel then sees only the real `hd` lanes of each).
pub fn head_groups(heads: usize, hd: usize, kd: usize) -> Vec<(usize, usize)> {
    if kd == hd {
        vec![(0, heads)]
    } else {
        (0..heads).map(|i| (i * kd, 1)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host;

    fn vals(n: usize, seed: u32) -> Vec<f32> {
        crate::host::test_values(n, seed)
    }

    /// Zero-padded heads (hd 16 → kernel 64) give the same q/k/v lanes (weights and biases) and
    /// the same output projection.
    #[test]
    fn padded_heads_are_exact() {
        let (heads, hd, kd, h, n) = (3, 16, 64, 40, 5);
        let x = vals(n * h, 7);
        let q = vals(heads * hd * h, 1);
        let y = host::gemm(&x, &q, None, n, heads * hd, h);
        let yp = host::gemm(
            &x,
            &pad_head_rows(&q, h, heads, hd, kd),
            None,
            n,
            heads * kd,
            h,
        );
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
        let bias: Vec<f32> = (0..heads * hd).map(|i| i as f32).collect();
        let bp = pad_head_rows(&bias, 1, heads, hd, kd);
        assert_eq!(bp.len(), heads * kd);
        assert_eq!(bp[kd + 3], 19.0);
        assert_eq!(bp[hd], 0.0);
        let o = vals(h * heads * hd, 2);
        let out = host::gemm(&y, &o, None, n, h, heads * hd);
        let op = pad_head_cols(&o, h, heads, hd, kd);
        assert_eq!(out, host::gemm(&yp, &op, None, n, h, heads * kd));
        // Unpadded: both are the identity.
        assert_eq!(pad_head_rows(&q, h, heads, hd, hd), q);
        assert_eq!(pad_head_cols(&o, h, heads, hd, hd), o);
    }

    #[test]
    fn head_groups_cover_every_head_once() {
        assert_eq!(head_groups(16, 96, 96), vec![(0, 16)]);
        assert_eq!(head_groups(3, 16, 64), vec![(0, 1), (64, 1), (128, 1)]);
    }

    #[test]
    fn attention_head_dim_follows_the_kernels() {
        for b in [Precision::Bf16, Precision::F16] {
            assert_eq!(attention_head_dim(b, 16).ok(), Some(64));
            assert_eq!(attention_head_dim(b, 64).ok(), Some(64));
            assert_eq!(attention_head_dim(b, 65).ok(), Some(72));
            assert_eq!(attention_head_dim(b, 96).ok(), Some(96));
            let e = attention_head_dim(b, 97);
            assert!(
                matches!(&e, Err(GpuError::Shape { what, .. }) if what.contains(b.name())),
                "{e:?}"
            );
            assert!(attention_head_dim(b, 0).is_err());
        }
        let f = Precision::F32;
        assert_eq!(attention_head_dim(f, 24).ok(), Some(24));
        assert_eq!(
            attention_head_dim(f, MAX_F32_ATTN_HEAD_DIM).ok(),
            Some(MAX_F32_ATTN_HEAD_DIM)
        );
        assert!(attention_head_dim(f, MAX_F32_ATTN_HEAD_DIM + 1).is_err());
    }
}
