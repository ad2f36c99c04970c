//! Video through a model (issue 24, `docs/VIDEO.md`): the video preprocessor a checkpoint asks
//! for, and a video's rows from its tower in one pass, as upstream's `get_video_features` runs
//! it: glm5_next one attention segment per frame pair, gemma4 each frame one image.

use std::path::Path;

use crate::device_rows::Dest;
use crate::engine::Inputs;
use crate::prep::from_checkpoint_configs;
use crate::tower_error::InputError;
use crate::{DeviceOut, DeviceRows};
use crate::{Family, Model, ModelError, PrepOpenError, RowsDtype, TowerError, WeightFile};
use vision_prep::video::{read_video_config, VideoPlan, VideoPreprocessor, VideoSettings};
use vision_prep::{ModelConfigs, PrepError, Video};

/// Largest `video_preprocessor_config.json` read (a config is a few hundred bytes).
const MAX_VIDEO_CONFIG_BYTES: u64 = 1 << 20;

/// One video's result: its plan and its rows in the LM width, in the order the plan's
/// placeholder runs lay out (glm5_next frame pair after pair, gemma4 frame after frame).
#[derive(Debug, Clone)]
pub struct EncodedVideo {
    /// What the prompt holds for this video.
    pub plan: VideoPlan,
    /// `[plan.rows, width]` row-major.
    pub rows: Vec<f32>,
    /// The LM width.
    pub width: usize,
}

/// One video's rows on a CUDA device, with its plan.
#[derive(Debug)]
pub struct DeviceEncodedVideo {
    /// What the prompt holds for this video.
    pub plan: VideoPlan,
    /// The rows, `plan.rows` of them in one buffer (glm5_next one "image"; gemma4 one per frame,
    /// consecutive).
    pub rows: DeviceRows,
}

/// The video preprocessor the model at `model` (opened as `file`) asks for: its configs, its
/// `video_preprocessor_config.json` (or `processor_config.json` `video_processor`), and the token
/// ids of `config.json` (the tokenizer files when it lacks one). A GGUF mmproj (gemma4, no
/// processor config) gets `Gemma4VideoProcessor`'s defaults with the file's patch size, token ids
/// unknown. Every family without a video path here gives [`PrepError::NoVideoPath`].
pub fn video_preprocessor_for(
    model: &Path,
    file: &WeightFile,
    settings: VideoSettings,
) -> Result<VideoPreprocessor, PrepOpenError> {
    let prep_err = PrepOpenError::at(model);
    let ck = match file {
        WeightFile::Gguf(g) => {
            // The class defaults with the file's patch size, validated as a config would be
            // (patch bounds, the max_soft_tokens set, no fps); no config: token ids unknown.
            let mut dict = serde_json::json!({"video_processor_type": "Gemma4VideoProcessor"});
            if let Some(p) = g.get("clip.vision.patch_size").and_then(|v| v.as_u32()) {
                dict["patch_size"] = p.into();
            }
            return VideoPreprocessor::from_configs(
                &ModelConfigs::default(),
                Some(&dict),
                settings,
            )
            .map_err(prep_err);
        }
        WeightFile::SafeTensors(ck) => ck,
    };
    let video_cfg = match ck.json_file("video_preprocessor_config.json", MAX_VIDEO_CONFIG_BYTES)? {
        Some(v) => Some(v),
        // A directory path the checkpoint did not resolve configs for: read it directly.
        None if model.is_dir() => read_video_config(model).map_err(prep_err)?,
        None => None,
    };
    from_checkpoint_configs(
        model,
        ck,
        |cfg| VideoPreprocessor::from_configs(cfg, video_cfg.as_ref(), settings),
        |pre| pre.tokens().all().iter().all(|t| t.id.is_some()),
    )
}

impl Model {
    /// The video preprocessor of this model with `settings` (see [`video_preprocessor_for`]);
    /// keep it to encode many videos with [`Model::encode_video_with`].
    pub fn video_preprocessor(
        &self,
        settings: VideoSettings,
    ) -> Result<VideoPreprocessor, ModelError> {
        let file =
            WeightFile::open(self.path()).map_err(|e| ModelError::Tower(TowerError::Open(e)))?;
        if !matches!(self.family(), Family::Glm5Next | Family::Gemma4) {
            return Err(self.video_err(PrepError::NoVideoPath(format!(
                "the {} tower",
                self.family().name()
            ))));
        }
        Ok(video_preprocessor_for(self.path(), &file, settings)?)
    }

    /// Admits the video from its metadata, samples, decodes and prepares the sampled frames, and
    /// runs the tower once over the whole video (glm5_next `video_grid_thw = [t, h, w]`: `t`
    /// attention segments, one per frame pair; gemma4: each frame one image of the pass). Rows f32 on the host. A video vision-prep refuses (its
    /// budgets, a frame, a family without video) is `ModelError::Prep(PrepOpenError::Prep {..})`
    /// with the [`PrepError`] as its source.
    pub fn encode_video(
        &self,
        video: &Video<'_>,
        settings: VideoSettings,
    ) -> Result<EncodedVideo, ModelError> {
        let pre = self.video_preprocessor(settings)?;
        self.encode_video_with(&pre, video)
    }

    /// [`Model::encode_video`] with a video preprocessor built once ([`Model::video_preprocessor`]).
    pub fn encode_video_with(
        &self,
        pre: &VideoPreprocessor,
        video: &Video<'_>,
    ) -> Result<EncodedVideo, ModelError> {
        let (plan, rows) = self.with_video(pre, video, |m, images| {
            let rows = m.tower().run(images)?;
            let n = rows.per_image.iter().map(Vec::len).sum::<usize>() / rows.width.max(1);
            Ok((rows, n))
        })?;
        let width = rows.width;
        Ok(EncodedVideo {
            plan,
            rows: rows.per_image.concat(),
            width,
        })
    }

    /// [`Model::encode_video_with`] with the rows left on the model's CUDA device in `dtype`
    /// (see [`Model::encode_device`]). A model on the CPU refuses.
    pub fn encode_video_device(
        &self,
        pre: &VideoPreprocessor,
        video: &Video<'_>,
        dtype: RowsDtype,
    ) -> Result<DeviceEncodedVideo, ModelError> {
        let (plan, rows) = self.with_video(pre, video, |m, images| {
            let r = m.tower().run_device(images, Dest::Owned(dtype))?;
            let n = r.rows_per_image.iter().sum();
            Ok((r.owned, n))
        })?;
        let rows = rows.ok_or_else(|| {
            ModelError::Tower(TowerError::Unsupported("no rows came back".into()))
        })?;
        Ok(DeviceEncodedVideo { plan, rows })
    }

    /// [`Model::encode_video_device`] into the caller's memory `out`, ordered with the caller's
    /// stream (see [`Model::encode_device_into`]); returns the plan once the work is queued.
    pub fn encode_video_device_into(
        &self,
        pre: &VideoPreprocessor,
        video: &Video<'_>,
        out: &DeviceOut,
    ) -> Result<VideoPlan, ModelError> {
        let (plan, ()) = self.with_video(pre, video, |m, images| {
            let r = m.tower().run_device(images, Dest::Caller(out))?;
            Ok(((), r.rows_per_image.iter().sum()))
        })?;
        Ok(plan)
    }

    /// A video refused by vision-prep (metadata budgets, a frame, no video path), as
    /// `ModelError::Prep(PrepOpenError::Prep { path: the model, source })`.
    fn video_err(&self, source: PrepError) -> ModelError {
        ModelError::Prep(PrepOpenError::Prep {
            path: self.path().to_path_buf(),
            source,
        })
    }

    /// Prepares the video, hands the tower inputs to `run` (glm5_next: one glm image of grid
    /// `[t, h, w]`; gemma4: one image per frame; `run` returns its result and the rows of all of
    /// them), and checks the count against the plan.
    fn with_video<R>(
        &self,
        pre: &VideoPreprocessor,
        video: &Video<'_>,
        run: impl FnOnce(&Model, Inputs<'_>) -> Result<(R, usize), InputError>,
    ) -> Result<(VideoPlan, R), ModelError> {
        if pre.family() != self.family() {
            return Err(self.video_err(PrepError::NoVideoPath(format!(
                "a {} video preprocessor for the {} tower",
                pre.family().name(),
                self.family().name()
            ))));
        }
        let prepared = pre.prepare_video(video).map_err(|e| self.video_err(e))?;
        // A prepared video without its tower tensors is `TowerError::Unsupported`.
        let images = match self.family() {
            Family::Glm5Next | Family::Gemma4 => Inputs::Video(&prepared),
            other => {
                return Err(self.video_err(PrepError::NoVideoPath(format!(
                    "the {} tower",
                    other.name()
                ))))
            }
        };
        let (out, got) = run(self, images).map_err(|e| ModelError::of_images(e.at(self.path())))?;
        let planned = prepared.plan.rows as usize;
        if got != planned {
            return Err(ModelError::RowsOffPlan {
                index: 0,
                got,
                planned,
            });
        }
        Ok((prepared.plan, out))
    }
}
