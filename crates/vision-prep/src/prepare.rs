//! From a decoded RGB image to the upstream processor's tensors, landing exactly on the plan.

use std::borrow::Cow;

use rayon::prelude::*;

use crate::law::{Glm5NextLaw as Glm5, Law};
use crate::plan::{Geometry, Plan};
use crate::resize::{resize_rgb, Filter};
use crate::source::RgbImage;

/// Element type of a [`NamedTensor`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 64-bit signed integer.
    I64,
    /// 8-bit unsigned integer (booleans as 0/1).
    U8,
}

impl DType {
    /// safetensors dtype string.
    pub fn safetensors_name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::I64 => "I64",
            DType::U8 => "U8",
        }
    }
}

/// Tensor payload.
#[derive(Debug, Clone, PartialEq)]
pub enum TensorData {
    /// f32 values.
    F32(Vec<f32>),
    /// i64 values.
    I64(Vec<i64>),
    /// u8 values.
    U8(Vec<u8>),
}

/// One output tensor under its upstream name, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedTensor {
    /// Upstream name (`pixel_values`, `image_grid_thw`, …).
    pub name: &'static str,
    /// Shape.
    pub shape: Vec<usize>,
    /// Values (length = product of `shape`).
    pub data: TensorData,
}

impl NamedTensor {
    /// Element type.
    pub fn dtype(&self) -> DType {
        match self.data {
            TensorData::F32(_) => DType::F32,
            TensorData::I64(_) => DType::I64,
            TensorData::U8(_) => DType::U8,
        }
    }

    /// Little-endian bytes, as safetensors stores them.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        match &self.data {
            TensorData::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::U8(v) => v.clone(),
        }
    }
}

/// A prepared image: the tensors the upstream processor returns, and the plan they land on.
#[derive(Debug, Clone, PartialEq)]
pub struct Prepared {
    /// The header-only plan (equal to what the tensors imply; checked by tests).
    pub plan: Plan,
    /// Tensors under upstream names, in upstream order.
    pub tensors: Vec<NamedTensor>,
}

/// gemma4 tower inputs (borrowed).
#[derive(Debug, Clone, Copy)]
pub struct Gemma4Inputs<'a> {
    /// `[P, 3·p²]` rows, (ky, kx, c) flattened, values in [0, 1], no padding rows.
    pub patches: &'a [f32],
    /// `[P, 2]` (x, y).
    pub positions: &'a [i64],
    /// P.
    pub num_patches: usize,
}

/// glm (glm5_next / GLM-OCR) tower inputs (borrowed).
#[derive(Debug, Clone, Copy)]
pub struct GlmInputs<'a> {
    /// `[N, 3·t·p²]` rows (c, t, kh, kw), 2×2 block-major.
    pub rows: &'a [f32],
    /// `[t, gh, gw]`.
    pub grid_thw: [i64; 3],
}

/// step3p7 tower inputs (borrowed).
#[derive(Debug, Clone, Copy)]
pub struct Step3p7Inputs<'a> {
    /// `[1, 3, S, S]` global view.
    pub global: &'a [f32],
    /// `[k, 3, s, s]` local crops (empty when k = 0).
    pub local: &'a [f32],
    /// k.
    pub num_local: usize,
    /// `[k]` newline flags.
    pub newline_mask: &'a [u8],
}

impl Prepared {
    /// Tensor by upstream name.
    pub fn tensor(&self, name: &str) -> Option<&NamedTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }
    fn f32s(&self, name: &str) -> Option<&[f32]> {
        match &self.tensor(name)?.data {
            TensorData::F32(v) => Some(v),
            _ => None,
        }
    }
    fn i64s(&self, name: &str) -> Option<&[i64]> {
        match &self.tensor(name)?.data {
            TensorData::I64(v) => Some(v),
            _ => None,
        }
    }
    /// gemma4 view (`None` for other families).
    pub fn gemma4(&self) -> Option<Gemma4Inputs<'_>> {
        let positions = self.i64s("image_position_ids")?;
        Some(Gemma4Inputs {
            patches: self.f32s("pixel_values")?,
            positions,
            num_patches: positions.len() / 2,
        })
    }
    /// glm view (`None` for other families).
    pub fn glm(&self) -> Option<GlmInputs<'_>> {
        let g = self.i64s("image_grid_thw")?;
        Some(GlmInputs {
            rows: self.f32s("pixel_values")?,
            grid_thw: [*g.first()?, *g.get(1)?, *g.get(2)?],
        })
    }
    /// step3p7 view (`None` for other families).
    pub fn step3p7(&self) -> Option<Step3p7Inputs<'_>> {
        let k = *self.i64s("num_local_patches")?.first()? as usize;
        let mask = match self.tensor("patch_newline_masks").map(|t| &t.data) {
            Some(TensorData::U8(v)) => v.as_slice(),
            _ => &[],
        };
        Some(Step3p7Inputs {
            global: self.f32s("pixel_values")?,
            local: self.f32s("pixel_values_local").unwrap_or(&[]),
            num_local: k,
            newline_mask: mask,
        })
    }
}

/// Fused rescale+normalize constants exactly as transformers builds them
/// (image_processing_backends.py `_fuse_mean_std_and_rescale_factor`: float32 tensor × (1/rescale_factor)).
fn fused(mean: &[f64; 3], std: &[f64; 3], rescale_factor: f64) -> ([f32; 3], [f32; 3]) {
    let k = (1.0 / rescale_factor) as f32;
    let m = [mean[0] as f32 * k, mean[1] as f32 * k, mean[2] as f32 * k];
    let s = [std[0] as f32 * k, std[1] as f32 * k, std[2] as f32 * k];
    (m, s)
}

/// `tvF.normalize`: `(x − m) / s` in f32, per channel, u8 → f32 lookup table.
fn norm_lut(m: [f32; 3], s: [f32; 3]) -> [[f32; 256]; 3] {
    let mut lut = [[0f32; 256]; 3];
    for (c, row) in lut.iter_mut().enumerate() {
        for (v, x) in row.iter_mut().enumerate() {
            *x = (v as f32 - m[c]) / s[c];
        }
    }
    lut
}

fn resize(img: &RgbImage, w: usize, h: usize, f: Filter, parallel: bool) -> RgbImage {
    RgbImage {
        width: w,
        height: h,
        data: resize_rgb(&img.data, img.width, img.height, w, h, f, parallel),
    }
}

/// `resize`, borrowing when the size does not change (torch's weights are then the identity).
fn resize_cow(img: &RgbImage, w: usize, h: usize, f: Filter, parallel: bool) -> Cow<'_, RgbImage> {
    if (w, h) == (img.width, img.height) {
        Cow::Borrowed(img)
    } else {
        Cow::Owned(resize(img, w, h, f, parallel))
    }
}

/// Resized u8 views in upstream order (gemma4: the resized image; glm: the padded canvas;
/// step3p7: the global 728² view then each 504² crop). Exposed for parity tests against `resized_u8` fixtures.
pub fn resized_views(law: &Law, plan: &Plan, img: &RgbImage, parallel: bool) -> Vec<RgbImage> {
    match (&plan.geometry, law) {
        (Geometry::Gemma4 { .. }, Law::Gemma4(l)) => {
            vec![resize(
                img,
                plan.target.0 as usize,
                plan.target.1 as usize,
                l.filter,
                parallel,
            )]
        }
        (Geometry::Glm { content, .. }, Law::Glm5Next(Glm5 { filter, .. })) => {
            let (cw, ch) = (content.0 as usize, content.1 as usize);
            let c = resize_cow(img, cw, ch, *filter, parallel);
            let (tw, th) = (plan.target.0 as usize, plan.target.1 as usize);
            let mut canvas = vec![0u8; tw * th * 3];
            for y in 0..ch {
                canvas[y * tw * 3..y * tw * 3 + cw * 3]
                    .copy_from_slice(&c.data[y * cw * 3..(y + 1) * cw * 3]);
            }
            vec![RgbImage {
                width: tw,
                height: th,
                data: canvas,
            }]
        }
        (Geometry::Glm { .. }, Law::Glm46V(l)) => {
            vec![resize(
                img,
                plan.target.0 as usize,
                plan.target.1 as usize,
                l.filter,
                parallel,
            )]
        }
        (
            Geometry::Step3p7 {
                layout,
                global_side,
                crop_side,
                ..
            },
            Law::Step3p7(l),
        ) => {
            let padded_owned;
            let padded = if layout.square_pad {
                let side = img.width.max(img.height);
                let mut d = vec![0u8; side * side * 3];
                for y in 0..img.height {
                    d[y * side * 3..y * side * 3 + img.width * 3]
                        .copy_from_slice(&img.data[y * img.width * 3..(y + 1) * img.width * 3]);
                }
                padded_owned = RgbImage {
                    width: side,
                    height: side,
                    data: d,
                };
                &padded_owned
            } else {
                img
            };
            let g1 = resize_cow(
                padded,
                layout.global.0 as usize,
                layout.global.1 as usize,
                l.filter,
                parallel,
            );
            let gs = *global_side as usize;
            let mut out = vec![resize(&g1, gs, gs, l.filter, parallel)];
            if layout.window > 0 {
                let (cw, ch, win) = (
                    layout.crop.0 as usize,
                    layout.crop.1 as usize,
                    layout.window as usize,
                );
                let crop = resize_cow(padded, cw, ch, l.filter, parallel);
                let mut tiles = Vec::new();
                for i in (0..ch).step_by(win) {
                    for j in (0..cw).step_by(win) {
                        let (th, tw) = ((ch - i).min(win), (cw - j).min(win));
                        let mut d = Vec::with_capacity(th * tw * 3);
                        for y in i..i + th {
                            d.extend_from_slice(
                                &crop.data[(y * cw + j) * 3..(y * cw + j + tw) * 3],
                            );
                        }
                        tiles.push(RgbImage {
                            width: tw,
                            height: th,
                            data: d,
                        });
                    }
                }
                let cs = *crop_side as usize;
                let resized: Vec<RgbImage> = if parallel {
                    tiles
                        .par_iter()
                        .map(|t| resize(t, cs, cs, l.filter, false))
                        .collect()
                } else {
                    tiles
                        .iter()
                        .map(|t| resize(t, cs, cs, l.filter, false))
                        .collect()
                };
                out.extend(resized);
            }
            out
        }
        _ => Vec::new(),
    }
}

/// Build the upstream tensors for `img` under `law`, following `plan`.
pub fn prepare(law: &Law, plan: Plan, img: &RgbImage, parallel: bool) -> Prepared {
    let views = resized_views(law, &plan, img, parallel);
    let tensors = match (law, &plan.geometry) {
        (Law::Gemma4(l), Geometry::Gemma4 { gh, gw, .. }) => {
            let v = &views[0];
            let p = l.patch_size as usize;
            let (gh, gw) = (*gh as usize, *gw as usize);
            let scale = l.rescale_factor as f32;
            let lut: Vec<f32> = (0..256).map(|x| x as f32 * scale).collect();
            let row = p * p * 3;
            let mut pv: Vec<f32> = Vec::with_capacity(gh * gw * row);
            let mut pos = Vec::with_capacity(gh * gw * 2);
            for py in 0..gh {
                for px in 0..gw {
                    for ky in 0..p {
                        let src = ((py * p + ky) * v.width + px * p) * 3;
                        pv.extend(v.data[src..src + p * 3].iter().map(|&s| lut[s as usize]));
                    }
                    pos.push(px as i64);
                    pos.push(py as i64);
                }
            }
            vec![
                NamedTensor {
                    name: "pixel_values",
                    shape: vec![1, gh * gw, row],
                    data: TensorData::F32(pv),
                },
                NamedTensor {
                    name: "image_position_ids",
                    shape: vec![1, gh * gw, 2],
                    data: TensorData::I64(pos),
                },
            ]
        }
        (Law::Glm5Next(_) | Law::Glm46V(_), Geometry::Glm { gh, gw, merge, .. }) => {
            let (p, t, mean, std, rf) = match law {
                Law::Glm5Next(l) => (
                    l.patch_size,
                    l.temporal_patch_size,
                    l.mean,
                    l.std,
                    l.rescale_factor,
                ),
                Law::Glm46V(l) => (
                    l.patch_size,
                    l.temporal_patch_size,
                    l.mean,
                    l.std,
                    l.rescale_factor,
                ),
                _ => (14, 2, [0.0; 3], [1.0; 3], 1.0 / 255.0),
            };
            let (m, s) = fused(&mean, &std, rf);
            let lut = norm_lut(m, s);
            let v = &views[0];
            let (p, t, mg) = (p as usize, t as usize, *merge as usize);
            let (gh, gw) = (*gh as usize, *gw as usize);
            let row = 3 * t * p * p;
            // Rows are written strictly in output order (no zero-fill pass): block-major patches,
            // each row (c, t, ky, kx).
            let mut rows: Vec<f32> = Vec::with_capacity(gh * gw * row);
            for bh in 0..gh / mg {
                for bw in 0..gw / mg {
                    for ih in 0..mg {
                        for iw in 0..mg {
                            let (py, px) = (bh * mg + ih, bw * mg + iw);
                            for (c, lc) in lut.iter().enumerate() {
                                for _ in 0..t {
                                    for ky in 0..p {
                                        let src = &v.data[((py * p + ky) * v.width + px * p) * 3..]
                                            [..p * 3];
                                        rows.extend(
                                            src.chunks_exact(3).map(|px| lc[px[c] as usize]),
                                        );
                                    }
                                }
                            }
                        }
                    }
                }
            }
            vec![
                NamedTensor {
                    name: "pixel_values",
                    shape: vec![gh * gw, row],
                    data: TensorData::F32(rows),
                },
                NamedTensor {
                    name: "image_grid_thw",
                    shape: vec![1, 3],
                    data: TensorData::I64(vec![1, gh as i64, gw as i64]),
                },
            ]
        }
        (Law::Step3p7(l), Geometry::Step3p7 { newline_mask, .. }) => {
            let (m, s) = fused(&l.mean, &l.std, l.rescale_factor);
            let lut = norm_lut(m, s);
            // CHW planes, written in output order.
            let planar_into = |v: &RgbImage, out: &mut Vec<f32>| {
                for (c, lc) in lut.iter().enumerate() {
                    out.extend(v.data.chunks_exact(3).map(|px| lc[px[c] as usize]));
                }
            };
            let gs = l.image_size as usize;
            let cs = l.patch_size as usize;
            let k = views.len() - 1;
            let mut out = vec![NamedTensor {
                name: "pixel_values",
                shape: vec![1, 3, gs, gs],
                data: TensorData::F32({
                    let mut g = Vec::with_capacity(3 * gs * gs);
                    planar_into(&views[0], &mut g);
                    g
                }),
            }];
            out.push(NamedTensor {
                name: "num_local_patches",
                shape: vec![1],
                data: TensorData::I64(vec![k as i64]),
            });
            if k > 0 {
                let mut local: Vec<f32> = Vec::with_capacity(k * 3 * cs * cs);
                for v in &views[1..] {
                    planar_into(v, &mut local);
                }
                out.push(NamedTensor {
                    name: "pixel_values_local",
                    shape: vec![k, 3, cs, cs],
                    data: TensorData::F32(local),
                });
                out.push(NamedTensor {
                    name: "patch_newline_masks",
                    shape: vec![k],
                    data: TensorData::U8(newline_mask.iter().map(|&b| u8::from(b)).collect()),
                });
            }
            out
        }
        _ => Vec::new(),
    };
    Prepared { plan, tensors }
}
