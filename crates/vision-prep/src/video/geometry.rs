//! Frame geometry: glm5_next's video `smart_resize` and content size, each sampled frame
//! resized (and padded) onto its canvas, and glm5_next's `patchify` of the canvases.

use rayon::prelude::*;

use super::VideoPlan;
use crate::error::{PrepError, Result};
use crate::law;
use crate::norm::{Normalize, Window};
use crate::resize::{resize_rgb, Filter};
use crate::source::RgbImage;

/// glm5_next `smart_resize` over `num_frames` frames (video_processing_glm5_next.py:74-135,
/// called by `resize` with the sampled frame count, :250-259): the canvas `(height, width)` within
/// the whole video's budget `min/max_image_tokens · temporal · factor²`. With `num_frames` =
/// the temporal patch size it is the image law (`law::glm5_next_canvas`; a test holds them equal).
pub fn smart_resize(
    law: &law::Glm5NextLaw,
    height: u32,
    width: u32,
    num_frames: u64,
) -> Result<(u64, u64)> {
    let factor =
        u64::from(law.patch_size) * u64::from(law.merge_size) * u64::from(law.patch_expand_factor);
    let tf = u64::from(law.temporal_patch_size);
    let ppt = tf * factor * factor;
    let min_pixels = law.min_image_tokens.saturating_mul(ppt);
    let max_pixels = law.max_image_tokens.saturating_mul(ppt);
    let align = |v: f64| -> u64 { (v / factor as f64).ceil() as u64 * factor };
    let (h, w) = (u64::from(height), u64::from(width));
    // `max(temporal_factor, round(num_frames / temporal_factor) * temporal_factor)` (:119).
    let aligned_frames = tf.max((num_frames as f64 / tf as f64).round_ties_even() as u64 * tf);
    let mut ah = align(h as f64);
    let mut aw = align(w as f64);
    let mut budget = aligned_frames.saturating_mul(ah).saturating_mul(aw);
    if budget < min_pixels {
        // `sqrt(min_pixels / (num_frames * height * width))` (:126): the frame count, not the aligned one.
        let scale = (min_pixels as f64 / (num_frames * h * w) as f64).sqrt();
        ah = align(((h as f64 * scale).ceil()).max(1.0));
        aw = align(((w as f64 * scale).ceil()).max(1.0));
        budget = aligned_frames.saturating_mul(ah).saturating_mul(aw);
    }
    if budget > max_pixels {
        let minimum = aligned_frames.saturating_mul(factor * factor);
        if max_pixels < minimum {
            return Err(PrepError::Unplannable {
                processor: "Glm5NextVideoProcessor".into(),
                width,
                height,
                reason: format!(
                    "max_pixels={max_pixels} is too small: at least {minimum} pixels are \
                     required for one aligned patch of {num_frames} frames"
                ),
            });
        }
        let (mut low, mut high) = (1i64, h as i64);
        let (mut bh, mut bw) = (factor, factor);
        while low <= high {
            let ch = (low + high) / 2;
            let cw = ((w * ch as u64) as f64 / h as f64).floor().max(1.0);
            let cand_h = align(ch as f64);
            let cand_w = align(cw);
            if aligned_frames.saturating_mul(cand_h).saturating_mul(cand_w) <= max_pixels {
                bh = cand_h;
                bw = cand_w;
                low = ch + 1;
            } else {
                high = ch - 1;
            }
        }
        ah = bh;
        aw = bw;
    }
    Ok((ah, aw))
}

/// The content `(height, width)` pasted at the canvas' top-left (video_processing_glm5_next.py:262-267):
/// `s = min(H/h, W/w)`, capped at 1 unless `num_frames·h·w` is under the minimum budget;
/// `content = max(1, min(canvas, floor(side·s)))`.
pub fn content_size(
    law: &law::Glm5NextLaw,
    height: u32,
    width: u32,
    canvas: (u64, u64),
    num_frames: u64,
) -> (u64, u64) {
    let factor =
        u64::from(law.patch_size) * u64::from(law.merge_size) * u64::from(law.patch_expand_factor);
    let ppt = u64::from(law.temporal_patch_size) * factor * factor;
    let (h, w) = (f64::from(height), f64::from(width));
    let (th, tw) = canvas;
    let mut scale = (th as f64 / h).min(tw as f64 / w);
    let pixels = num_frames
        .saturating_mul(u64::from(height))
        .saturating_mul(u64::from(width));
    if pixels >= ppt.saturating_mul(law.min_image_tokens) {
        scale = scale.min(1.0);
    }
    let ch = ((h * scale).floor() as u64).min(th).max(1);
    let cw = ((w * scale).floor() as u64).min(tw).max(1);
    (ch, cw)
}

/// One sampled frame resized to the plan's content size and (glm5_next, `pad`) pasted at the
/// top-left of a black canvas (video_processing_glm5_next.py:262-275); gemma4 resizes only
/// (video_processing_gemma4.py:187-212). Either skips the resize when the size is unchanged.
pub(super) fn canvas(
    frame: &[u8],
    width: usize,
    height: usize,
    plan: &VideoPlan,
    filter: Filter,
    pad: bool,
) -> Result<RgbImage> {
    let (cw, ch) = (plan.content.0 as usize, plan.content.1 as usize);
    let (tw, th) = (plan.target.0 as usize, plan.target.1 as usize);
    let resized = if (cw, ch) == (width, height) {
        None
    } else {
        Some(resize_rgb(frame, width, height, cw, ch, filter, false)?)
    };
    if !pad {
        return Ok(RgbImage {
            width: cw,
            height: ch,
            data: resized.unwrap_or_else(|| frame.to_vec()),
        });
    }
    let content: &[u8] = resized.as_deref().unwrap_or(frame);
    let mut data = vec![0u8; tw * th * 3];
    for (dst, src) in data
        .chunks_exact_mut(tw * 3)
        .zip(content.chunks_exact(cw * 3))
    {
        dst[..cw * 3].copy_from_slice(src);
    }
    Ok(RgbImage {
        width: tw,
        height: th,
        data,
    })
}

/// `patchify` (video_processing_glm5_next.py:314-352) of the normalised canvases: rows ordered
/// by frame pair, then 2×2 block-major; each row `(c, tp, ky, kx)`, frames `2k`, `2k+1` as
/// `tp` = 0, 1 of pair `k`.
pub(super) fn patchify(
    frames: &[RgbImage],
    p: usize,
    tp: usize,
    merge: usize,
    plan: &VideoPlan,
    norm: &Normalize,
    parallel: bool,
) -> Vec<f32> {
    let [t, gh, gw] = plan.grid_thw.map(|x| x as usize);
    let pp = p * p;
    let row = 3 * tp * pp;
    let per_pair = gh * gw * row;
    let mut out = vec![0f32; t * per_pair];
    let body = |(k, dst): (usize, &mut [f32])| {
        let mut stage = vec![0f32; 3 * pp];
        for (j, r) in dst.chunks_exact_mut(row).enumerate() {
            let (bh, rest) = (
                j / ((gw / merge) * merge * merge),
                j % ((gw / merge) * merge * merge),
            );
            let (bw, m) = (rest / (merge * merge), rest % (merge * merge));
            let (py, px) = (bh * merge + m / merge, bw * merge + m % merge);
            for s in 0..tp {
                // patchify pads an odd count with the last frame (:325-328).
                let f = &frames[(k * tp + s).min(frames.len() - 1)];
                let (a, rest) = stage.split_at_mut(pp);
                let (b, c) = rest.split_at_mut(pp);
                norm.window(
                    &f.data,
                    Window::square(f.width, px * p, py * p, p),
                    [a, b, c],
                );
                for ch in 0..3 {
                    let o = ch * tp * pp + s * pp;
                    r[o..o + pp].copy_from_slice(&stage[ch * pp..(ch + 1) * pp]);
                }
            }
        }
    };
    if parallel {
        out.par_chunks_mut(per_pair).enumerate().for_each(body);
    } else {
        out.chunks_mut(per_pair).enumerate().for_each(body);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::law::Glm5NextLaw;

    /// The video `smart_resize` with `num_frames` = the temporal patch is the image law.
    #[test]
    fn smart_resize_of_two_frames_is_the_image_law() {
        for max_t in [8000u64, 240_000, 12] {
            let l = Glm5NextLaw {
                max_image_tokens: max_t,
                ..Default::default()
            };
            for (w, h) in [
                (20, 15),
                (1, 1),
                (28, 28),
                (1000, 60),
                (60, 1000),
                (1920, 1080),
                (4000, 3000),
                (333, 777),
                (12000, 17),
            ] {
                let canvas = law::glm5_next_canvas(&l, h, w).map_err(|e| e.to_string());
                let video = smart_resize(&l, h, w, 2).map_err(|e| e.to_string());
                assert_eq!(video, canvas, "{w}x{h} max {max_t}");
                if let Ok(c) = canvas {
                    assert_eq!(
                        content_size(&l, h, w, c, 2),
                        law::glm5_next_content(&l, h, w, c),
                        "{w}x{h}"
                    );
                }
            }
        }
    }
}
