//! The attention core every tower runs on its fused q|k|v GEMM output, written once: the
//! per-head norm + rope of q and k (and v's norm where the family has one), then variable-length
//! flash attention into the attention buffer. A family states only its own law: which of q, k, v
//! are normed, with which weights and clamps ([`QkNorm`]), its rope layout and its softmax scale.

use crate::{
    head_groups, ActElem, AttnArgs, Clamp, Device, DeviceBuffer, GemmBuffer, GpuError,
    InputBuffers, Mat, QkvSpec, Result, RopeLayout, RopeSpec,
};

/// The attention of one pass over a fused `[tokens, 3·heads·kd]` q | k | v buffer (heads padded
/// from `head_dim` to `kernel_head_dim` where the kernels need it, [`head_groups`]): the same for
/// every layer ([`Device::qkv_attention`]).
#[derive(Debug, Clone, Copy)]
pub struct QkvAttention<'a> {
    /// Heads (the same for q, k and v).
    pub heads: usize,
    /// The model's head dim (the lanes the norm and the rope see).
    pub head_dim: usize,
    /// The head dim the attention kernels run at (`head_dim`, or the next kernel size when padded).
    pub kernel_head_dim: usize,
    /// The family's rope of q and k.
    pub rope: RopeSpec<'a>,
    /// Softmax scale.
    pub scale: f32,
    /// Segment boundaries `[segments + 1]` on the device.
    pub cu_seqlens: &'a DeviceBuffer<i32>,
    /// The same boundaries on the host.
    pub cu_seqlens_host: &'a [i32],
}

/// A layer's per-head norms before the rope: which of q, k, v are normed, q's and k's weights,
/// the epsilon and the clamps on read.
#[derive(Debug, Clone, Copy)]
pub struct QkNorm<'a> {
    /// Per-head RMSNorm weights of q and k (`None` = weightless); used where `norm` says so.
    pub q_weight: Option<&'a DeviceBuffer<f32>>,
    /// See `q_weight`.
    pub k_weight: Option<&'a DeviceBuffer<f32>>,
    /// Which of q, k, v get a per-head RMSNorm.
    pub norm: [bool; 3],
    /// RMSNorm epsilon.
    pub eps: f32,
    /// Clamps applied to q, k, v on read.
    pub clamps: [Clamp; 3],
}

impl<'a> QkNorm<'a> {
    /// Weighted RMSNorms of q and k, v untouched, no clamps (the glm law; others change fields).
    pub fn weighted(q: &'a DeviceBuffer<f32>, k: &'a DeviceBuffer<f32>, eps: f32) -> Self {
        QkNorm {
            q_weight: Some(q),
            k_weight: Some(k),
            norm: [true, true, false],
            eps,
            clamps: [Clamp::NONE; 3],
        }
    }

    /// No norm at all (rope only); `eps` is handed to the kernel unused.
    pub fn none(eps: f32) -> Self {
        QkNorm {
            q_weight: None,
            k_weight: None,
            norm: [false; 3],
            eps,
            clamps: [Clamp::NONE; 3],
        }
    }
}

impl InputBuffers {
    /// The attention of a pass over these inputs: `heads` of `head_dim` run at `kernel_head_dim`,
    /// the rope of `layout` over the positions with `inv_freq`, softmax `scale`, the segments
    /// `cu_host` (their copy on the device is these inputs').
    pub fn attention<'a>(
        &'a self,
        (heads, head_dim, kernel_head_dim): (usize, usize, usize),
        (layout, inv_freq): (RopeLayout, &'a DeviceBuffer<f32>),
        scale: f32,
        cu_host: &'a [i32],
    ) -> QkvAttention<'a> {
        QkvAttention {
            heads,
            head_dim,
            kernel_head_dim,
            rope: RopeSpec {
                layout,
                pos: &self.pos,
                inv_freq,
            },
            scale,
            cu_seqlens: &self.cu,
            cu_seqlens_host: cu_host,
        }
    }
}

impl Device {
    /// The attention core of `a` on `qkv` (the norms of `norm` + rope in place, one launch per
    /// head group), then flash attention into `attn` (`[tokens, heads·kd]`); both buffers in one
    /// precision.
    pub fn qkv_attention(
        &self,
        qkv: &mut GemmBuffer,
        attn: &mut GemmBuffer,
        a: &QkvAttention<'_>,
        norm: &QkNorm<'_>,
    ) -> Result<()> {
        match (qkv, attn) {
            (GemmBuffer::Bf16(qkv), GemmBuffer::Bf16(attn)) => {
                self.qkv_attention_in(qkv, attn, a, norm)
            }
            (GemmBuffer::F16(qkv), GemmBuffer::F16(attn)) => {
                self.qkv_attention_in(qkv, attn, a, norm)
            }
            (GemmBuffer::F32(qkv), GemmBuffer::F32(attn)) => {
                self.qkv_attention_in(qkv, attn, a, norm)
            }
            _ => Err(GpuError::Shape {
                op: "qkv_attention",
                what: "buffers of different precisions".into(),
            }),
        }
    }

    fn qkv_attention_in<T: ActElem>(
        &self,
        qkv: &mut DeviceBuffer<T>,
        attn: &mut DeviceBuffer<T>,
        a: &QkvAttention<'_>,
        norm: &QkNorm<'_>,
    ) -> Result<()> {
        let cu = a.cu_seqlens_host;
        let n = cu.last().map_or(0, |&t| t as usize);
        let (heads, hd, kd) = (a.heads, a.head_dim, a.kernel_head_dim);
        let wp = heads * kd;
        for (off, nh) in head_groups(heads, hd, kd) {
            let spec = QkvSpec {
                tokens: n,
                heads: nh,
                head_dim: hd,
                ld: 3 * wp,
                offsets: [off, wp + off, 2 * wp + off],
                q_weight: norm.q_weight,
                k_weight: norm.k_weight,
                norm: norm.norm,
                eps: norm.eps,
                clamps: norm.clamps,
            };
            self.qk_norm_rope(qkv, &spec, Some(&a.rope))?;
        }
        let args = AttnArgs {
            q: (&*qkv, Mat::strided(n, wp, 3 * wp, 0)),
            k: (&*qkv, Mat::strided(n, wp, 3 * wp, wp)),
            v: (&*qkv, Mat::strided(n, wp, 3 * wp, 2 * wp)),
            heads,
            head_dim: kd,
            cu_seqlens: a.cu_seqlens,
            cu_seqlens_host: cu,
            scale: a.scale,
            variant: None,
        };
        self.flash_attn(&args, attn, Mat::dense(n, wp))
    }
}
