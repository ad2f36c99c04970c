//! Frame sampling from a video's metadata: the metadata checks, then upstream's
//! `sample_frames` (glm5_next by time, gemma4 by count) and gemma4's `mm:ss` timestamps.

use super::{Gemma4VideoLaw, Glm5NextVideoLaw, VideoLimits, VideoMetadata};
use crate::error::{PrepError, Result};

/// The metadata checks that need nothing else: a frame rate (where the law samples by time), at
/// least one frame, finite values, and the frame budget.
pub(super) fn check_metadata(
    meta: &VideoMetadata,
    limits: &VideoLimits,
    fps_required: bool,
) -> Result<()> {
    if meta.total_num_frames == 0 {
        return Err(PrepError::BadVideo("a video of 0 frames".into()));
    }
    if meta.total_num_frames > limits.max_frames {
        return Err(PrepError::VideoOverBudget {
            what: "frames".into(),
            amount: meta.total_num_frames,
            budget: limits.max_frames,
        });
    }
    match meta.fps {
        // video_processing_glm5_next.py:182-186: glm5_next's sampling needs the video's fps
        // (gemma4 samples by count and assumes 24 fps for its timestamps).
        None if !fps_required => {}
        None => {
            return Err(PrepError::BadVideo(
                "no fps in the metadata: glm5_next samples frames by time (fps is required)".into(),
            ))
        }
        Some(f) if !(f.is_finite() && f > 0.0) => {
            return Err(PrepError::BadVideo(format!(
                "fps must be a positive number, got {f}"
            )))
        }
        Some(_) => {}
    }
    if let Some(d) = meta.duration {
        if !(d.is_finite() && d >= 0.0) {
            return Err(PrepError::BadVideo(format!(
                "duration must be a non-negative number of seconds, got {d}"
            )));
        }
    }
    Ok(())
}

/// `np.linspace(start, stop, num, dtype=int)` (numpy 2.4 `function_base.py`): `k·step + start`
/// in f64 with `step = (stop − start)/(num − 1)` (a zero step: `k/(num−1)·delta + start`), the
/// last value set to `stop`, then floored.
fn linspace_int(start: f64, stop: f64, num: u64) -> Vec<i64> {
    let delta = stop - start;
    let div = num.saturating_sub(1) as f64;
    let mut out: Vec<f64> = (0..num)
        .map(|k| {
            let k = k as f64;
            if num > 1 {
                let step = delta / div;
                if step == 0.0 {
                    k / div * delta + start
                } else {
                    k * step + start
                }
            } else {
                k * delta + start
            }
        })
        .collect();
    if num > 1 {
        if let Some(last) = out.last_mut() {
            *last = stop;
        }
    }
    out.iter_mut().for_each(|y| *y = y.floor());
    out.into_iter().map(|y| y as i64).collect()
}

/// `Glm5NextVideoProcessor.sample_frames` (video_processing_glm5_next.py:167-236), exactly: the
/// sampled indices, deduplicated in order, an odd count completed by repeating the last.
/// `meta` must have passed [`check_metadata`] (fps present, at least one frame).
pub fn glm5_next_sample(law: &Glm5NextVideoLaw, meta: &VideoMetadata) -> Result<Vec<u64>> {
    let fps = meta
        .fps
        .ok_or_else(|| PrepError::BadVideo("no fps in the metadata".into()))?;
    let total = meta.total_num_frames;
    if total == 0 {
        return Err(PrepError::BadVideo("a video of 0 frames".into()));
    }
    let max_frame_idx = (total - 1) as f64;
    // `metadata.duration or round(max_frame_idx / fps) + 1` (:190): Python's round, half to even.
    let duration = match meta.duration {
        Some(d) if d != 0.0 => d,
        _ => (max_frame_idx / fps).round_ties_even() + 1.0,
    };
    // `int(duration)` before the max_duration cap (:192).
    let max_seconds = duration.trunc();
    let duration = if law.max_duration <= 0.0 {
        duration
    } else {
        duration.min(law.max_duration)
    };
    let target = law.fps;
    // `int(duration * target_fps)`, capped by max_frames (:196-197); a product past u64 is
    // over max_frames anyway.
    let product = (duration * target).trunc();
    let extract_t = if product >= law.max_frames as f64 {
        law.max_frames
    } else {
        product.max(0.0) as u64
    };
    let per_frame = 1.0 / fps;
    let mut indices: Vec<i64> = if total < extract_t {
        linspace_int(0.0, max_frame_idx, extract_t)
    } else {
        let mut taken = Vec::new();
        let mut current = 0.0f64;
        let inv = 1.0 / target;
        for i in 0..total {
            if i as f64 * per_frame >= current {
                current += inv;
                taken.push(i as i64);
                if current >= max_seconds {
                    break;
                }
            }
        }
        taken
    };
    let len = indices.len() as u64;
    if len < extract_t {
        let (start, end) = match (indices.first(), indices.last()) {
            (Some(&a), Some(&b)) => (a as f64, b as f64),
            _ => (0.0, max_frame_idx.max(0.0)),
        };
        indices = linspace_int(start, end, extract_t);
    } else if len > extract_t {
        indices = linspace_int(0.0, max_frame_idx, extract_t);
    }
    let mut seen = std::collections::HashSet::new();
    let mut uniq: Vec<u64> = Vec::with_capacity(indices.len() + 1);
    for i in indices {
        // Every index lies in 0..total (linspace between indices of the video); a negative or
        // past-the-end one would be upstream's IndexError.
        let u = u64::try_from(i)
            .ok()
            .filter(|&u| u < total)
            .ok_or_else(|| {
                PrepError::BadVideo(format!("sampled frame index {i} outside the video"))
            })?;
        if seen.insert(u) {
            uniq.push(u);
        }
    }
    if uniq.len() % 2 == 1 {
        if let Some(&last) = uniq.last() {
            uniq.push(last);
        }
    }
    if uniq.is_empty() {
        // upstream returns the empty list; its processor then fails on the empty video
        // (ZeroDivisionError in smart_resize, checked against transformers 5.23).
        return Err(PrepError::BadVideo(format!(
            "no frame sampled ({} s at {target} fps gives 0 frames)",
            duration
        )));
    }
    Ok(uniq)
}

/// The base `sample_frames` → `default_sample_indices_fn` with `num_frames`
/// (video_processing_utils.py:605-633, video_utils.py:317-356): `arange(n) · total // n`;
/// `n > total` is upstream's ValueError.
pub fn gemma4_sample(law: &Gemma4VideoLaw, meta: &VideoMetadata) -> Result<Vec<u64>> {
    let total = meta.total_num_frames;
    let n = law.num_frames;
    if n > total {
        return Err(PrepError::BadVideo(format!(
            "num_frames={n} exceeds the video's {total} frames (upstream raises; set num_frames lower)"
        )));
    }
    Ok((0..n)
        .map(|k| (u128::from(k) * u128::from(total) / u128::from(n)) as u64)
        .collect())
}

/// Python's float `//` and `%` for `x ≥ 0`, `y > 0` (CPython `float_divmod`: `mod = fmod(x, y)`,
/// `div = (x − mod)/y`, floored, plus one when `div − floor > 0.5`).
fn py_divmod(x: f64, y: f64) -> (f64, f64) {
    let m = x % y;
    let div = (x - m) / y;
    let mut fd = div.floor();
    if div - fd > 0.5 {
        fd += 1.0;
    }
    (fd, m)
}

/// processing_gemma4.py:216 `f"{int(seconds // 60):02d}:{int(seconds % 60):02d}"`.
pub(super) fn gemma4_timestamp(seconds: f64) -> String {
    let (minutes, rest) = py_divmod(seconds, 60.0);
    format!("{:02}:{:02}", minutes.trunc() as u64, rest.trunc() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::law::Glm5NextLaw;
    use crate::video::smart_resize;
    use crate::video::test_util::fixtures;
    use safetensors::SafeTensors;
    use serde_json::Value;

    /// Runs `[[first, step, count], …]` back to an index list.
    fn expand(runs: &Value) -> Vec<u64> {
        let mut out = Vec::new();
        for r in runs.as_array().expect("runs") {
            let (a, d, n) = (
                r[0].as_i64().unwrap_or(0),
                r[1].as_i64().unwrap_or(0),
                r[2].as_i64().unwrap_or(0),
            );
            out.extend((0..n).map(|k| (a + k * d) as u64));
        }
        out
    }

    /// A float written as Python's repr, parsed exactly (`str::parse` rounds correctly).
    fn float(v: &Value) -> Option<f64> {
        v.as_str().map(|s| s.parse::<f64>().expect("a float repr"))
    }

    /// Upstream's own functions on a grid of inputs (`outputs/video_laws/grid.safetensors`,
    /// written by `oracle/fam_video.py`): `Glm5NextVideoProcessor.sample_frames` over frame
    /// counts, frame rates, durations, target rates, `max_frames` and `max_duration`; its
    /// `smart_resize` over frame counts, sizes and budgets; gemma4's `num_frames` sampling and
    /// `mm:ss` timestamps. Every value equal, every upstream refusal an error here.
    #[test]
    fn upstream_law_grids() {
        let path = fixtures().join("outputs/video_laws/grid.safetensors");
        let bytes = std::fs::read(&path).expect("video_laws/grid (cargo xtask fixtures)");
        let (_, header) = SafeTensors::read_metadata(&bytes).expect("header");
        let meta: Value = header
            .metadata()
            .as_ref()
            .and_then(|m| m.get("fixture"))
            .and_then(|s| serde_json::from_str(s).ok())
            .expect("fixture metadata");
        let rows = |key: &str| meta[key]["rows"].as_array().cloned().expect(key);
        let mut checked = 0;
        for r in rows("glm5_next_sample_frames") {
            let law = Glm5NextVideoLaw {
                fps: float(&r[3]).expect("target"),
                max_frames: r[4].as_u64().expect("max_frames"),
                max_duration: r[5].as_f64().expect("max_duration"),
                ..Default::default()
            };
            let m = VideoMetadata {
                total_num_frames: r[0].as_u64().expect("total"),
                fps: float(&r[1]),
                duration: float(&r[2]),
            };
            let got = glm5_next_sample(&law, &m);
            match &r[6] {
                Value::String(e) => assert!(got.is_err(), "{r}: upstream {e}, here {got:?}"),
                // an empty sample: upstream's processor then fails (ZeroDivisionError in
                // smart_resize); refused here at once
                runs if expand(runs).is_empty() => assert!(got.is_err(), "{r}: {got:?}"),
                runs => assert_eq!(got.ok(), Some(expand(runs)), "{r}"),
            }
            checked += 1;
        }
        for r in rows("glm5_next_smart_resize") {
            let l = Glm5NextLaw {
                max_image_tokens: r[3].as_u64().expect("max"),
                min_image_tokens: r[4].as_u64().expect("min"),
                ..Default::default()
            };
            let (n, h, w) = (
                r[0].as_u64().expect("n"),
                r[1].as_u64().expect("h") as u32,
                r[2].as_u64().expect("w") as u32,
            );
            let got = smart_resize(&l, h, w, n);
            match &r[5] {
                Value::String(e) => assert!(got.is_err(), "{r}: upstream {e}, here {got:?}"),
                hw => assert_eq!(
                    got.ok(),
                    Some((hw[0].as_u64().unwrap_or(0), hw[1].as_u64().unwrap_or(0))),
                    "{r}"
                ),
            }
            checked += 1;
        }
        for r in rows("gemma4_sample_frames") {
            let law = Gemma4VideoLaw {
                num_frames: r[1].as_u64().expect("num_frames"),
                ..Default::default()
            };
            let m = VideoMetadata {
                total_num_frames: r[0].as_u64().expect("total"),
                fps: Some(24.0),
                duration: None,
            };
            let got = gemma4_sample(&law, &m);
            match &r[2] {
                Value::String(e) => assert!(got.is_err(), "{r}: upstream {e}, here {got:?}"),
                idx => {
                    let want: Vec<u64> = idx
                        .as_array()
                        .expect("indices")
                        .iter()
                        .filter_map(Value::as_u64)
                        .collect();
                    assert_eq!(got.ok(), Some(want), "{r}");
                }
            }
            checked += 1;
        }
        for r in rows("gemma4_timestamps") {
            let seconds = r[0].as_u64().expect("index") as f64 / float(&r[1]).expect("fps");
            assert_eq!(
                Some(gemma4_timestamp(seconds).as_str()),
                r[2].as_str(),
                "{r}"
            );
            checked += 1;
        }
        assert!(checked >= 800, "{checked} grid rows");
    }
}
