//! The plan of a video from its metadata and frame size alone: sampling, sizes, grid, rows and
//! the prompt (no frame is looked at).

use super::geometry::{content_size, smart_resize};
use super::sample::{check_metadata, gemma4_sample, gemma4_timestamp, glm5_next_sample};
use super::{
    Gemma4VideoLaw, Glm5NextVideoLaw, VideoLaw, VideoMetadata, VideoPiece, VideoPlan,
    VideoPreprocessor, VideoTokens, GEMMA4_VIDEO_DEFAULT_FPS,
};
use crate::config::Token;
use crate::error::{PrepError, Result};
use crate::law;
use crate::plan::{Family, PromptRun};

impl VideoPreprocessor {
    /// The indices of the frames upstream's sampling picks for this metadata (after the metadata
    /// checks): a caller holding encoded frames needs to read only these, and may hand in empty
    /// sources for the others (they are never looked at).
    pub fn sampled_indices(&self, meta: &VideoMetadata) -> Result<Vec<u64>> {
        match &self.law {
            VideoLaw::Glm5Next(l) => {
                check_metadata(meta, &self.settings.limits, true)?;
                glm5_next_sample(l, meta)
            }
            VideoLaw::Gemma4(l) => {
                check_metadata(meta, &self.settings.limits, false)?;
                gemma4_sample(l, meta)
            }
        }
    }

    /// The plan of a video of `width × height` frames with this metadata: sampling, sizes, grid,
    /// rows and prompt, from the metadata alone. The metadata budgets apply (frame count, sampled
    /// pixels, output bytes); nothing is decoded.
    pub fn plan_video(&self, meta: &VideoMetadata, width: u32, height: u32) -> Result<VideoPlan> {
        let indices = self.sampled_indices(meta)?;
        if width == 0 || height == 0 {
            return Err(PrepError::ZeroSized { width, height });
        }
        let n = indices.len() as u64;
        let pixels = n
            .saturating_mul(u64::from(width))
            .saturating_mul(u64::from(height));
        if pixels > self.settings.limits.max_pixels {
            return Err(PrepError::VideoOverBudget {
                what: format!("pixels of the {n} sampled {width}x{height} frames"),
                amount: pixels,
                budget: self.settings.limits.max_pixels,
            });
        }
        let plan = match &self.law {
            VideoLaw::Glm5Next(l) => self.plan_glm5_next(l, meta, indices, width, height)?,
            VideoLaw::Gemma4(l) => self.plan_gemma4(l, meta, indices, width, height)?,
        };
        if plan.tensor_bytes > self.settings.max_output_bytes {
            return Err(PrepError::OutputTooLarge {
                bytes: plan.tensor_bytes,
                budget: self.settings.max_output_bytes,
                rows: plan.rows,
            });
        }
        Ok(plan)
    }

    fn plan_glm5_next(
        &self,
        l: &Glm5NextVideoLaw,
        meta: &VideoMetadata,
        indices: Vec<u64>,
        width: u32,
        height: u32,
    ) -> Result<VideoPlan> {
        let n = indices.len() as u64;
        let il = l.image_law();
        let (th, tw) = smart_resize(&il, height, width, n)?;
        let (ch, cw) = content_size(&il, height, width, (th, tw), n);
        let p = u64::from(l.patch_size);
        let m = u64::from(l.merge_size);
        let tp = u64::from(l.temporal_patch_size);
        // patchify (:325-330): an odd count would repeat the last frame; sampling made it even.
        let gt = n.div_ceil(tp);
        let (gh, gw) = (th / p, tw / p);
        let rows = gt * gh * gw / (m * m);
        let fps = meta.fps.unwrap_or(24.0);
        let timestamps: Vec<f64> = indices.iter().map(|&i| i as f64 / fps).collect();
        let prompt = self.prompt_glm5_next(&timestamps, gt, rows / gt.max(1));
        let values_per_row = 3 * tp * p * p;
        let tensor_bytes = gt
            .saturating_mul(gh)
            .saturating_mul(gw)
            .saturating_mul(values_per_row)
            .saturating_mul(4)
            .saturating_add(24);
        Ok(VideoPlan {
            family: Family::Glm5Next,
            processor_class: "Glm5NextVideoProcessor",
            width,
            height,
            frames_indices: indices,
            timestamps,
            target: (tw, th),
            content: (cw, ch),
            grid_thw: [gt, gh, gw],
            values_per_row,
            tensor_bytes,
            rows,
            prompt,
        })
    }

    fn plan_gemma4(
        &self,
        l: &Gemma4VideoLaw,
        meta: &VideoMetadata,
        indices: Vec<u64>,
        width: u32,
        height: u32,
    ) -> Result<VideoPlan> {
        let n = indices.len() as u64;
        let (th, tw) = law::gemma4_target(&l.image_law(), height, width).map_err(|e| match e {
            PrepError::Unplannable {
                width,
                height,
                reason,
                ..
            } => PrepError::Unplannable {
                processor: "Gemma4VideoProcessor".into(),
                width,
                height,
                reason,
            },
            e => e,
        })?;
        let (th, tw) = (u64::from(th), u64::from(tw));
        let p = u64::from(l.patch_size);
        let k = u64::from(l.pooling_kernel_size);
        let (gh, gw) = (th / p, tw / p);
        let per_frame = gh * gw / (k * k);
        let max_patches = u64::from(l.max_soft_tokens) * k * k;
        let values_per_row = 3 * p * p;
        // processing_gemma4.py:207-213: no fps → 24 for the timestamps.
        let fps = meta.fps.unwrap_or(GEMMA4_VIDEO_DEFAULT_FPS);
        let timestamps: Vec<f64> = indices.iter().map(|&i| i as f64 / fps).collect();
        let prompt = self.prompt_gemma4(&timestamps, per_frame);
        let tensor_bytes = n
            .saturating_mul(max_patches)
            .saturating_mul(values_per_row * 4 + 16)
            .saturating_add(16);
        Ok(VideoPlan {
            family: Family::Gemma4,
            processor_class: "Gemma4VideoProcessor",
            width,
            height,
            frames_indices: indices,
            timestamps,
            target: (tw, th),
            content: (tw, th),
            grid_thw: [n, gh, gw],
            values_per_row,
            tensor_bytes,
            rows: n * per_frame,
            prompt,
        })
    }

    /// processing_glm5_next.py `replace_video_token` (:62-91) wrapped in the chat template's
    /// begin/end of video.
    fn prompt_glm5_next(&self, timestamps: &[f64], pairs: u64, per_pair: u64) -> Vec<VideoPiece> {
        let VideoTokens::Glm5Next {
            begin_of_video,
            end_of_video,
            begin_of_image,
            end_of_image,
            image,
        } = &self.tokens
        else {
            return Vec::new();
        };
        let mut out = vec![run(begin_of_video, 1, false)];
        // `metadata.timestamps[::2]`, padded with its last value (or 0) to `num_frames` (:76-84).
        let firsts: Vec<f64> = timestamps.iter().step_by(2).copied().collect();
        for k in 0..pairs as usize {
            let ts = firsts.get(k).or(firsts.last()).copied().unwrap_or(0.0);
            out.push(run(begin_of_image, 1, false));
            out.push(run(image, per_pair, true));
            out.push(run(end_of_image, 1, false));
            // `f"{timestamp_sec:.1f} seconds"` (:183): Rust's `{:.1}` rounds the exact binary
            // value half to even, as Python's format does.
            out.push(VideoPiece::Text(format!("{ts:.1} seconds")));
        }
        out.push(run(end_of_video, 1, false));
        out
    }

    /// processing_gemma4.py `replace_video_token` (:203-220): per sampled frame
    /// `f"{mm:02d}:{ss:02d} "` + boi + `n × <|video|>` + eoi, joined by a space.
    fn prompt_gemma4(&self, timestamps: &[f64], per_frame: u64) -> Vec<VideoPiece> {
        let VideoTokens::Gemma4 { boi, video, eoi } = &self.tokens else {
            return Vec::new();
        };
        let mut out = Vec::with_capacity(timestamps.len() * 4);
        for (i, &t) in timestamps.iter().enumerate() {
            let sep = if i == 0 { "" } else { " " };
            out.push(VideoPiece::Text(format!("{sep}{} ", gemma4_timestamp(t))));
            out.push(run(boi, 1, false));
            out.push(run(video, per_frame, true));
            out.push(run(eoi, 1, false));
        }
        out
    }
}

/// A run of one prompt token.
fn run(t: &Token, count: u64, embeds: bool) -> VideoPiece {
    VideoPiece::Run(PromptRun {
        token: t.clone(),
        count,
        embeds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::ImageSource;
    use crate::video::test_util::{glm5, glm5_configs};
    use crate::video::{
        Video, VideoFrames, VideoLimits, VideoSettings, DEFAULT_MAX_VIDEO_BYTES,
        DEFAULT_MAX_VIDEO_FRAMES, DEFAULT_MAX_VIDEO_PIXELS,
    };

    /// 10 000 frames are refused from the metadata alone: no frame is looked at (the raw frames
    /// here are empty slices and the encoded ones are not images: a frame check would say so).
    #[test]
    fn ten_thousand_frames_are_refused_from_the_metadata() {
        let pre = glm5();
        let meta = VideoMetadata {
            total_num_frames: 10_000,
            fps: Some(30.0),
            duration: None,
        };
        let empty: Vec<&[u8]> = vec![&[]; 10_000];
        let junk = [0u8; 4];
        let sources = vec![ImageSource::Bytes(&junk); 10_000];
        for frames in [
            VideoFrames::Rgb {
                width: 1920,
                height: 1080,
                frames: &empty,
            },
            VideoFrames::Encoded(&sources),
        ] {
            let video = Video {
                frames,
                metadata: meta,
            };
            for r in [
                pre.plan(&video).map(|_| ()),
                pre.prepare_video(&video).map(|_| ()),
            ] {
                match r {
                    Err(PrepError::VideoOverBudget {
                        what,
                        amount: 10_000,
                        budget: DEFAULT_MAX_VIDEO_FRAMES,
                    }) => assert_eq!(what, "frames"),
                    other => panic!("{other:?}"),
                }
            }
        }
        assert!(matches!(
            pre.plan_video(&meta, 1920, 1080),
            Err(PrepError::VideoOverBudget { .. })
        ));
    }

    /// 10⁹ pixels in total (4000 frames of 500×500 at the target rate, 2048 of them sampled)
    /// are refused from the metadata: by the sampled-pixel budget when planning, by the byte
    /// budget for raw frames (whose empty slices show no frame was read).
    #[test]
    fn a_billion_pixels_are_refused_from_the_metadata() {
        let pre = glm5();
        let meta = VideoMetadata {
            total_num_frames: 4000,
            fps: Some(2.0),
            duration: None,
        };
        match pre.plan_video(&meta, 500, 500) {
            Err(PrepError::VideoOverBudget { amount, budget, .. }) => {
                assert_eq!(amount, 2048 * 500 * 500);
                assert_eq!(budget, DEFAULT_MAX_VIDEO_PIXELS);
            }
            other => panic!("{other:?}"),
        }
        let empty: Vec<&[u8]> = vec![&[]; 4000];
        let video = Video {
            frames: VideoFrames::Rgb {
                width: 500,
                height: 500,
                frames: &empty,
            },
            metadata: meta,
        };
        match pre.prepare_video(&video) {
            Err(PrepError::VideoOverBudget { amount, budget, .. }) => {
                assert_eq!(amount, 4000 * 500 * 500 * 3);
                assert_eq!(budget, DEFAULT_MAX_VIDEO_BYTES);
            }
            other => panic!("{other:?}"),
        }
        // Within the frame and byte budgets, the sampled pixels still decide (encoded frames:
        // refused before any header is read, the bytes here are no image).
        let junk = [0u8; 4];
        let sources = vec![ImageSource::Bytes(&junk); 4000];
        let small = VideoPreprocessor::from_configs(
            &glm5_configs(),
            None,
            VideoSettings {
                limits: VideoLimits {
                    max_pixels: 1000,
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .expect("pre");
        let raw = vec![0u8; 20 * 20 * 3];
        let frames: Vec<&[u8]> = vec![&raw; 4000];
        let video = Video {
            frames: VideoFrames::Rgb {
                width: 20,
                height: 20,
                frames: &frames,
            },
            metadata: meta,
        };
        assert!(matches!(
            small.prepare_video(&video),
            Err(PrepError::VideoOverBudget { .. })
        ));
        let video = Video {
            frames: VideoFrames::Encoded(&sources),
            metadata: meta,
        };
        // the sampled encoded frames' headers are read first (to learn the size): junk is a frame error
        assert!(matches!(
            small.prepare_video(&video),
            Err(PrepError::VideoFrame { index: 0, .. })
        ));
    }
}
