//! From a decoded RGB image to the upstream processor's tensors, landing exactly on the plan.

use std::borrow::Cow;

use rayon::prelude::*;
use tower_core::{GemmaImage, GlmImage, StepImage, StepView};

use crate::law::{Glm5NextLaw as Glm5, Law};
use crate::norm::{Normalize, Window};
use crate::pages::Scratch;
use crate::plan::{Geometry, Plan};
use crate::resize::{resize_rgb_in, Filter};
use crate::rgb::RgbImage;

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
    pub fn gemma4(&self) -> Option<GemmaImage<'_>> {
        Some(GemmaImage {
            patches: self.f32s("pixel_values")?,
            positions: self.i64s("image_position_ids")?,
        })
    }
    /// glm view (`None` for other families).
    pub fn glm(&self) -> Option<GlmImage<'_>> {
        Some(GlmImage {
            patches: self.f32s("pixel_values")?,
            grid_thw: grid_row(self.i64s("image_grid_thw")?)?,
        })
    }
    /// step3p7 view (`None` for other families).
    pub fn step3p7(&self) -> Option<StepImage<'_>> {
        let k = usize::try_from(*self.i64s("num_local_patches")?.first()?).ok()?;
        let mask = match self.tensor("patch_newline_masks").map(|t| &t.data) {
            Some(TensorData::U8(v)) => v.as_slice(),
            _ => &[],
        };
        let view = |pixels, side| StepView {
            pixels,
            height: side,
            width: side,
        };
        let crops = match k {
            0 => Vec::new(),
            _ => {
                let side = square_side(&self.tensor("pixel_values_local")?.shape, k)?;
                let local = self.f32s("pixel_values_local")?;
                local
                    .chunks_exact((3 * side * side).max(1))
                    .take(k)
                    .map(|c| view(c, side))
                    .collect()
            }
        };
        Some(StepImage {
            global: view(
                self.f32s("pixel_values")?,
                square_side(&self.tensor("pixel_values")?.shape, 1)?,
            ),
            crops,
            newline_mask: (0..k)
                .map(|i| mask.get(i).is_some_and(|&m| m != 0))
                .collect(),
        })
    }
}

/// A `[t, h, w]` grid row of upstream's `*_grid_thw` as sizes (`None` if short or negative).
pub(crate) fn grid_row(g: &[i64]) -> Option<[usize; 3]> {
    let d = |i: usize| usize::try_from(*g.get(i)?).ok();
    Some([d(0)?, d(1)?, d(2)?])
}

/// S of a `[n, 3, S, S]` shape (`None` for any other shape).
fn square_side(shape: &[usize], n: usize) -> Option<usize> {
    match *shape {
        [m, 3, s, s2] if m == n && s == s2 => Some(s),
        _ => None,
    }
}

/// Fused rescale+normalize constants exactly as transformers builds them
/// (image_processing_backends.py `_fuse_mean_std_and_rescale_factor`: float32 tensor × (1/rescale_factor)).
pub(crate) fn fused(mean: &[f64; 3], std: &[f64; 3], rescale_factor: f64) -> ([f32; 3], [f32; 3]) {
    let k = (1.0 / rescale_factor) as f32;
    let m = [mean[0] as f32 * k, mean[1] as f32 * k, mean[2] as f32 * k];
    let s = [std[0] as f32 * k, std[1] as f32 * k, std[2] as f32 * k];
    (m, s)
}

/// How a preparation runs: rows over the rayon pool or not, and where its buffers come from.
#[derive(Clone, Copy)]
pub(crate) struct Cx<'s> {
    /// Split rows and tiles over the rayon pool.
    pub parallel: bool,
    /// Buffers for intermediates (given back when done).
    pub scratch: &'s Scratch,
    /// Buffers for the f32 output tensors (handed back by the caller, if ever).
    pub outputs: &'s Scratch<f32>,
}

impl Cx<'_> {
    /// One thread, or the rayon pool, without kept buffers.
    fn plain(parallel: bool) -> Cx<'static> {
        Cx {
            parallel,
            scratch: Scratch::none(),
            outputs: crate::pages::no_outputs(),
        }
    }

    /// One thread (for work already spread over the pool).
    fn serial(self) -> Self {
        Cx {
            parallel: false,
            ..self
        }
    }
}

fn resize(img: &RgbImage, w: usize, h: usize, f: Filter, cx: Cx<'_>) -> RgbImage {
    RgbImage {
        width: w,
        height: h,
        data: resize_rgb_in(
            &img.data,
            img.width,
            img.height,
            w,
            h,
            f,
            cx.parallel,
            cx.scratch,
        ),
    }
}

/// `resize`, borrowing when the size does not change (torch's weights are then the identity).
fn resize_cow<'a>(
    img: &'a RgbImage,
    w: usize,
    h: usize,
    f: Filter,
    cx: Cx<'_>,
) -> Cow<'a, RgbImage> {
    if (w, h) == (img.width, img.height) {
        Cow::Borrowed(img)
    } else {
        Cow::Owned(resize(img, w, h, f, cx))
    }
}

/// Give an owned intermediate's buffer back to the scratch.
fn give<T: ToOwned<Owned = RgbImage> + ?Sized>(scratch: &Scratch, c: Cow<'_, T>) {
    if let Cow::Owned(o) = c {
        scratch.give(o.data);
    }
}

/// step3p7's source: zero-padded (right/bottom) to a square for extreme aspect ratios.
fn step3p7_padded<'a>(img: &'a RgbImage, square_pad: bool, scratch: &Scratch) -> Cow<'a, RgbImage> {
    if !square_pad {
        return Cow::Borrowed(img);
    }
    let side = img.width.max(img.height);
    let d = paste(&img.data, img.width, img.height, side, side, scratch);
    Cow::Owned(RgbImage {
        width: side,
        height: side,
        data: d,
    })
}

/// One step3p7 local crop before normalisation.
enum StepTile {
    /// A full `crop_side²` window of the crop image at `(x, y)`: upstream's resize of it to
    /// `crop_side²` is the identity, so it is read in place.
    Window { x: usize, y: usize },
    /// A smaller edge window, resized to `crop_side²`.
    Resized(RgbImage),
}

/// step3p7's views: the global view, the crop image (`width × height`, when there are tiles) and
/// its tiles, row-major.
struct StepViews<'a> {
    global: RgbImage,
    crop: Cow<'a, [u8]>,
    crop_width: usize,
    tiles: Vec<StepTile>,
}

/// step3p7 views (image_processing_step3p7.py): global = resize to the capped size, then to
/// `global_side²`; crop = resize of the *uncapped* padded image to the snapped size, cut into
/// `window²` tiles, each resized to `crop_side²`. When the capped and snapped widths agree, both
/// resizes share one horizontal pass.
fn step3p7_views<'a>(
    l: &crate::law::Step3p7Law,
    layout: &crate::law::Step3p7Layout,
    global_side: usize,
    crop_side: usize,
    padded: &'a RgbImage,
    cx: Cx<'_>,
) -> StepViews<'a> {
    let (gw, gh) = (layout.global.0 as usize, layout.global.1 as usize);
    let (cw, ch, win) = (
        layout.crop.0 as usize,
        layout.crop.1 as usize,
        layout.window as usize,
    );
    let (g1, crop): (Cow<'a, [u8]>, Cow<'a, [u8]>) = if win > 0 && gw == cw {
        let mut both = crate::resize::resize_rgb_heights(
            &padded.data,
            padded.width,
            padded.height,
            gw,
            &[gh, ch],
            l.filter,
            cx.parallel,
            cx.scratch,
        );
        let crop = both.pop().unwrap_or_default();
        (both.pop().unwrap_or_default(), crop)
    } else {
        let g1 = match resize_cow(padded, gw, gh, l.filter, cx) {
            Cow::Borrowed(b) => Cow::Borrowed(b.data.as_slice()),
            Cow::Owned(o) => Cow::Owned(o.data),
        };
        let crop = if win > 0 {
            match resize_cow(padded, cw, ch, l.filter, cx) {
                Cow::Borrowed(b) => Cow::Borrowed(b.data.as_slice()),
                Cow::Owned(o) => Cow::Owned(o.data),
            }
        } else {
            Cow::Borrowed(&[][..])
        };
        (g1, crop)
    };
    let global = RgbImage {
        width: global_side,
        height: global_side,
        data: resize_rgb_in(
            &g1,
            gw,
            gh,
            global_side,
            global_side,
            l.filter,
            cx.parallel,
            cx.scratch,
        ),
    };
    if let Cow::Owned(b) = g1 {
        cx.scratch.give(b);
    }
    let mut windows = Vec::new();
    if win > 0 {
        for i in (0..ch).step_by(win) {
            for j in (0..cw).step_by(win) {
                windows.push((j, i, (cw - j).min(win), (ch - i).min(win)));
            }
        }
    }
    let cut = |&(x, y, tw, th): &(usize, usize, usize, usize)| {
        if (tw, th) == (crop_side, crop_side) {
            return StepTile::Window { x, y };
        }
        let mut d = Vec::with_capacity(th * tw * 3);
        for row in y..y + th {
            d.extend_from_slice(&crop[(row * cw + x) * 3..(row * cw + x + tw) * 3]);
        }
        let t = RgbImage {
            width: tw,
            height: th,
            data: d,
        };
        StepTile::Resized(resize(&t, crop_side, crop_side, l.filter, cx.serial()))
    };
    let tiles = if cx.parallel {
        windows.par_iter().map(cut).collect()
    } else {
        windows.iter().map(cut).collect()
    };
    StepViews {
        global,
        crop,
        crop_width: cw,
        tiles,
    }
}

/// Resized u8 views in upstream order (gemma4: the resized image; glm: the padded canvas;
/// step3p7: the global 728² view then each 504² crop), for parity tests against `resized_u8`
/// fixtures. `plan` must be the plan of `img` under `law` and `img.data` its `width·height·3`
/// bytes: [`crate::Preprocessor::resized_views`] checks both and is the public way in.
pub(crate) fn resized_views(
    law: &Law,
    plan: &Plan,
    img: &RgbImage,
    parallel: bool,
) -> Vec<RgbImage> {
    let cx = Cx::plain(parallel);
    match (&plan.geometry, law) {
        (Geometry::Gemma4 { .. }, Law::Gemma4(l)) => {
            vec![resize(
                img,
                plan.target.0 as usize,
                plan.target.1 as usize,
                l.filter,
                cx,
            )]
        }
        (Geometry::Glm { content, .. }, Law::Glm5Next(Glm5 { filter, .. })) => {
            vec![glm5_canvas(img, plan, *content, *filter, cx)]
        }
        (Geometry::Glm { .. }, Law::Glm46V(l)) => {
            vec![resize(
                img,
                plan.target.0 as usize,
                plan.target.1 as usize,
                l.filter,
                cx,
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
            let padded = step3p7_padded(img, layout.square_pad, cx.scratch);
            let cs = *crop_side as usize;
            let v = step3p7_views(l, layout, *global_side as usize, cs, &padded, cx);
            let mut out = vec![v.global];
            for t in v.tiles {
                out.push(match t {
                    StepTile::Resized(r) => r,
                    StepTile::Window { x, y } => {
                        let mut d = Vec::with_capacity(cs * cs * 3);
                        for row in y..y + cs {
                            let o = (row * v.crop_width + x) * 3;
                            d.extend_from_slice(&v.crop[o..o + cs * 3]);
                        }
                        RgbImage {
                            width: cs,
                            height: cs,
                            data: d,
                        }
                    }
                });
            }
            out
        }
        _ => Vec::new(),
    }
}

/// `src` (`w × h` RGB) at the top-left of a `tw × th` canvas, zero elsewhere; every byte written,
/// so a scratch buffer does.
fn paste(src: &[u8], w: usize, h: usize, tw: usize, th: usize, scratch: &Scratch) -> Vec<u8> {
    let mut canvas = scratch.take(tw * th * 3);
    for (y, row) in canvas.chunks_exact_mut(tw * 3).enumerate() {
        if y < h {
            row[..w * 3].copy_from_slice(&src[y * w * 3..(y + 1) * w * 3]);
            row[w * 3..].fill(0);
        } else {
            row.fill(0);
        }
    }
    canvas
}

/// glm5_next: the content resized, pasted at the top-left of a zero canvas of the target size.
fn glm5_canvas(
    img: &RgbImage,
    plan: &Plan,
    content: (u64, u64),
    filter: Filter,
    cx: Cx<'_>,
) -> RgbImage {
    let (cw, ch) = (content.0 as usize, content.1 as usize);
    let c = resize_cow(img, cw, ch, filter, cx);
    let (tw, th) = (plan.target.0 as usize, plan.target.1 as usize);
    let canvas = paste(&c.data, cw, ch, tw, th, cx.scratch);
    give(cx.scratch, c);
    RgbImage {
        width: tw,
        height: th,
        data: canvas,
    }
}

/// CHW planes of the window `win` of an RGB image, normalised, into `out` (`3·w·h` values).
/// Not streamed: non-temporal stores gained nothing on step3p7's 31 MB of planes (2026-12-02,
/// 1920×1080 JPEG, handed-back buffers: 13.4 → 13.9 ms), unlike glm's rows (`glm_rows`).
fn planar(src: &[u8], win: Window, norm: &Normalize, out: &mut [f32]) {
    let (r, rest) = out.split_at_mut(win.w * win.h);
    let (g, b) = rest.split_at_mut(win.w * win.h);
    norm.window(src, win, [r, g, b]);
}

/// glm rows: block-major patches (`merge²` blocks), each row `(c, t, ky, kx)` with the frame
/// repeated `t` times. Rows are written in output order (sequential stores beat scattering
/// `p`-value segments from planar rows: 26 -> 20 ms for a 50 MB glm5_next tensor), each
/// channel's first frame normalised and the other frames copied from it while it is hot.
#[allow(clippy::too_many_arguments)]
fn glm_rows(
    v: &RgbImage,
    p: usize,
    t: usize,
    merge: usize,
    gh: usize,
    gw: usize,
    norm: &Normalize,
    cx: Cx<'_>,
) -> Vec<f32> {
    let pp = p * p;
    let row = 3 * t * pp;
    // Streamed stores pay off only into memory already mapped (a handed-back buffer): on fresh
    // pages the kernel's zeroing has just put the lines in the cache (2026-12-02, one thread,
    // glm5_next 1920×1080 JPEG: handed back 12.7–13.5 → 11.0–11.1 ms; fresh 16.2 → 20.5 ms if
    // streamed too).
    let (mut rows, kept) = cx.outputs.take_kept(gh * gw * row);
    // A block row (`merge` patch rows) is contiguous in block-major order: the unit of work.
    let band = merge * gw * row;
    let body = |(bh, out): (usize, &mut [f32])| {
        // Each row is built in a cache-resident staging row, then copied (streamed) out.
        let mut stage = vec![0f32; row];
        for (j, dst) in out.chunks_exact_mut(row).enumerate() {
            let (bw, k) = (j / (merge * merge), j % (merge * merge));
            let (py, px) = (bh * merge + k / merge, bw * merge + k % merge);
            let (b0, rest) = stage.split_at_mut(t * pp);
            let (b1, b2) = rest.split_at_mut(t * pp);
            let first = [&mut b0[..pp], &mut b1[..pp], &mut b2[..pp]];
            norm.window(&v.data, Window::square(v.width, px * p, py * p, p), first);
            for block in [b0, b1, b2] {
                let (first, rest) = block.split_at_mut(pp);
                for f in rest.chunks_exact_mut(pp) {
                    f.copy_from_slice(first);
                }
            }
            if kept {
                crate::pages::stream_copy(dst, &stage);
            } else {
                dst.copy_from_slice(&stage);
            }
        }
        crate::pages::stream_fence();
    };
    if cx.parallel {
        rows.par_chunks_mut(band).enumerate().for_each(body);
    } else {
        rows.chunks_mut(band).enumerate().for_each(body);
    }
    rows
}

/// The size and filter a law resizes the whole decoded image to when that resized image is all
/// its tensors are made from (gemma4 and glm46v: the target; glm5_next: the content it pastes
/// into the padded canvas): [`prepare_resized`] then makes them, so a caller that resizes while
/// it decodes (`Preprocessor::prepare`) can hand it the result. `None` for step3p7 (several
/// views) and a plan of another law.
pub(crate) fn whole_resize(law: &Law, plan: &Plan) -> Option<(usize, usize, Filter)> {
    let target = (plan.target.0 as usize, plan.target.1 as usize);
    match (law, &plan.geometry) {
        (Law::Gemma4(l), Geometry::Gemma4 { .. }) => Some((target.0, target.1, l.filter)),
        (Law::Glm46V(l), Geometry::Glm { .. }) => Some((target.0, target.1, l.filter)),
        (Law::Glm5Next(l), Geometry::Glm { content, .. }) => {
            Some((content.0 as usize, content.1 as usize, l.filter))
        }
        _ => None,
    }
}

/// The tensors of a law that has a [`whole_resize`], from that resized image `v` (its buffer goes
/// back to `cx.scratch`): what [`prepare_in`] makes of the decoded image.
pub(crate) fn prepare_resized(law: &Law, plan: Plan, v: RgbImage, cx: Cx<'_>) -> Prepared {
    let tensors = match (law, &plan.geometry) {
        (Law::Gemma4(l), Geometry::Gemma4 { gh, gw, .. }) => {
            let p = l.patch_size as usize;
            let (gh, gw) = (*gh as usize, *gw as usize);
            let scale = l.rescale_factor as f32;
            let row = p * p * 3;
            // One patch row of the grid per task (serial, 0.35 ms of gemma4's 1080p request on
            // the H200 host: docs/PERF.md v0.29); every value of the buffer is written.
            let (mut pv, _) = cx.outputs.take_kept(gh * gw * row);
            let band = |(py, out): (usize, &mut [f32])| {
                for (px, patch) in out.chunks_exact_mut(row.max(1)).enumerate() {
                    for (ky, dst) in patch.chunks_exact_mut((p * 3).max(1)).enumerate() {
                        let src = ((py * p + ky) * v.width + px * p) * 3;
                        // `x · rescale_factor` in f32 (the one IEEE product upstream computes),
                        // in a form the compiler vectorises.
                        for (d, &s) in dst.iter_mut().zip(&v.data[src..src + p * 3]) {
                            *d = f32::from(s) * scale;
                        }
                    }
                }
            };
            if cx.parallel {
                pv.par_chunks_mut((gw * row).max(1))
                    .enumerate()
                    .for_each(band);
            } else {
                pv.chunks_mut((gw * row).max(1)).enumerate().for_each(band);
            }
            let mut pos = Vec::with_capacity(gh * gw * 2);
            for i in 0..gh * gw {
                pos.push((i % gw) as i64);
                pos.push((i / gw) as i64);
            }
            cx.scratch.give(v.data);
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
        (Law::Glm46V(_) | Law::Glm5Next(_), Geometry::Glm { gh, gw, merge, .. }) => {
            let (p, t, norm, v) = match law {
                Law::Glm46V(l) => (
                    l.patch_size,
                    l.temporal_patch_size,
                    fused(&l.mean, &l.std, l.rescale_factor),
                    v,
                ),
                Law::Glm5Next(l) => {
                    // the resized content, zero-padded right and bottom to the target (its canvas)
                    let (tw, th) = (plan.target.0 as usize, plan.target.1 as usize);
                    let data = paste(&v.data, v.width, v.height, tw, th, cx.scratch);
                    cx.scratch.give(v.data);
                    let canvas = RgbImage {
                        width: tw,
                        height: th,
                        data,
                    };
                    let norm = fused(&l.mean, &l.std, l.rescale_factor);
                    (l.patch_size, l.temporal_patch_size, norm, canvas)
                }
                _ => {
                    cx.scratch.give(v.data);
                    return Prepared {
                        plan,
                        tensors: Vec::new(),
                    };
                }
            };
            glm_tensors(
                p as usize,
                t as usize,
                norm,
                *merge as usize,
                (*gh as usize, *gw as usize),
                v,
                cx,
            )
        }
        _ => {
            cx.scratch.give(v.data);
            Vec::new()
        }
    };
    Prepared { plan, tensors }
}

/// glm's tensors (glm5_next, glm46v) from the resized view `v` (its buffer goes back to
/// `cx.scratch`): `patch_size` `p`, `temporal_patch_size` `t`, the fused normalisation, `merge`
/// and the `(gh, gw)` patch grid.
fn glm_tensors(
    p: usize,
    t: usize,
    (m, s): ([f32; 3], [f32; 3]),
    merge: usize,
    (gh, gw): (usize, usize),
    v: RgbImage,
    cx: Cx<'_>,
) -> Vec<NamedTensor> {
    let norm = Normalize::new(m, s);
    let rows = glm_rows(&v, p, t, merge, gh, gw, &norm, cx);
    cx.scratch.give(v.data);
    vec![
        NamedTensor {
            name: "pixel_values",
            shape: vec![gh * gw, 3 * t * p * p],
            data: TensorData::F32(rows),
        },
        NamedTensor {
            name: "image_grid_thw",
            shape: vec![1, 3],
            data: TensorData::I64(vec![1, gh as i64, gw as i64]),
        },
    ]
}

/// Build the upstream tensors for `img` under `law`, following `plan`, with the intermediates'
/// buffers from (and back to) `cx.scratch`. `plan` must be the plan of `img` under `law` and
/// `img.data` its `width·height·3` bytes: [`crate::Preprocessor::prepare_rgb`] checks both and is
/// the public way in (a public `prepare(law, plan, img)` took any plan and image and could hand
/// the resize a short buffer).
pub(crate) fn prepare_in(law: &Law, plan: Plan, img: &RgbImage, cx: Cx<'_>) -> Prepared {
    if let Some((w, h, filter)) = whole_resize(law, &plan) {
        let v = resize(img, w, h, filter, cx);
        return prepare_resized(law, plan, v, cx);
    }
    let parallel = cx.parallel;
    let tensors = match (law, &plan.geometry) {
        (
            Law::Step3p7(l),
            Geometry::Step3p7 {
                layout,
                global_side,
                crop_side,
                newline_mask,
                ..
            },
        ) => {
            let (m, s) = fused(&l.mean, &l.std, l.rescale_factor);
            let norm = Normalize::new(m, s);
            let padded = step3p7_padded(img, layout.square_pad, cx.scratch);
            let (gs, cs) = (*global_side as usize, *crop_side as usize);
            let v = step3p7_views(l, layout, gs, cs, &padded, cx);
            let k = v.tiles.len();
            let mut global = cx.outputs.take(3 * gs * gs);
            planar(
                &v.global.data,
                Window::square(gs, 0, 0, gs),
                &norm,
                &mut global,
            );
            let mut out = vec![
                NamedTensor {
                    name: "pixel_values",
                    shape: vec![1, 3, gs, gs],
                    data: TensorData::F32(global),
                },
                NamedTensor {
                    name: "num_local_patches",
                    shape: vec![1],
                    data: TensorData::I64(vec![k as i64]),
                },
            ];
            if k > 0 {
                let mut local = cx.outputs.take(k * 3 * cs * cs);
                let body = |(tile, o): (&StepTile, &mut [f32])| match tile {
                    StepTile::Window { x, y } => {
                        planar(&v.crop, Window::square(v.crop_width, *x, *y, cs), &norm, o)
                    }
                    StepTile::Resized(r) => planar(&r.data, Window::square(cs, 0, 0, cs), &norm, o),
                };
                if parallel {
                    v.tiles
                        .par_iter()
                        .zip(local.par_chunks_mut(3 * cs * cs))
                        .for_each(body);
                } else {
                    v.tiles
                        .iter()
                        .zip(local.chunks_mut(3 * cs * cs))
                        .for_each(body);
                }
                out.push(NamedTensor {
                    name: "pixel_values_local",
                    shape: vec![k, 3, cs, cs],
                    data: TensorData::F32(local),
                });
            }
            if k > 0 {
                out.push(NamedTensor {
                    name: "patch_newline_masks",
                    shape: vec![k],
                    data: TensorData::U8(newline_mask.iter().map(|&b| u8::from(b)).collect()),
                });
            }
            let StepViews {
                global,
                crop,
                tiles,
                ..
            } = v;
            cx.scratch.give(global.data);
            if let Cow::Owned(c) = crop {
                cx.scratch.give(c);
            }
            for t in tiles {
                if let StepTile::Resized(r) = t {
                    cx.scratch.give(r.data);
                }
            }
            give(cx.scratch, padded);
            out
        }
        _ => Vec::new(),
    };
    Prepared { plan, tensors }
}

#[cfg(test)]
mod tests;
