//! A model end to end: its preprocessor and its tower behind one handle — plan from the header,
//! encode many images in padding-free passes (on the CPU or a CUDA device), and the LM attention
//! law for image spans.

use crate::device_rows::{Dest, DeviceResult};
use crate::engine::Inputs;
use crate::tower::Rows;
use crate::tower_error::InputError;
use crate::{
    detect_family, preprocessor_for, Device, DeviceOut, DeviceRows, Family, LmAttention, Precision,
    PrepOpenError, ProcessorTensors, RequestTimings, RowsDtype, Tower, TowerError, TowerOptions,
    WeightFile,
};
use rayon::prelude::*;
use std::path::{Path, PathBuf};
use std::time::Instant;
use tower_core::{Classify, ErrorKind};
use vision_prep::{ImageSource, Plan, PrepSettings, Prepared, Preprocessor};

/// One image's result: its plan and its rows in the LM width, in the order the plan lays out.
#[derive(Debug, Clone)]
pub struct Encoded {
    /// What the prompt holds for this image.
    pub plan: Plan,
    /// `[plan.rows, width]` row-major.
    pub rows: Vec<f32>,
    /// The LM width.
    pub width: usize,
}

/// One request's rows on a CUDA device, with every image's plan (in request order; image `i`'s
/// rows are `rows.image_rows(i)`, `plans[i].rows` of them).
#[derive(Debug)]
pub struct DeviceEncoded {
    /// What the prompt holds for each image.
    pub plans: Vec<Plan>,
    /// The rows of all images in one device buffer.
    pub rows: DeviceRows,
    /// Where the call's time went on the host, stage by stage, until it returned.
    pub timings: RequestTimings,
}

/// Why a model could not be opened or could not encode.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The tower could not be built or run.
    #[error(transparent)]
    Tower(#[from] TowerError),
    /// The preprocessor could not be built.
    #[error(transparent)]
    Prep(#[from] PrepOpenError),
    /// An image was refused by admission, decoding or the processor.
    #[error("image {index}: {source}")]
    Image {
        /// Its position in the request.
        index: usize,
        /// What vision-prep found wrong.
        #[source]
        source: vision_prep::PrepError,
    },
    /// The tower refused an image its own processor prepared (e.g. a grid past a small model's
    /// position table): an image this model cannot take. The tower's message names what.
    #[error(transparent)]
    ImageRefused(TowerError),
    /// The tower gave a row count other than the plan's (a bug, never expected).
    #[error("image {index}: the tower gave {got} rows, the plan says {planned}")]
    RowsOffPlan {
        /// Its position in the request.
        index: usize,
        /// Rows the tower gave.
        got: usize,
        /// Rows the plan promised.
        planned: usize,
    },
}

/// A model: its preprocessor and its tower.
#[derive(Debug)]
pub struct Model {
    path: PathBuf,
    pre: Preprocessor,
    tower: Tower,
    lm: LmAttention,
}

impl ModelError {
    /// Whether the device ran out of memory; after a failed pass the model stays usable.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, ModelError::Tower(t) if t.is_out_of_memory())
    }

    /// The image of the request this error is about, where it names one.
    pub fn image_index(&self) -> Option<usize> {
        match self {
            ModelError::Image { index, .. } | ModelError::RowsOffPlan { index, .. } => Some(*index),
            ModelError::Tower(t) | ModelError::ImageRefused(t) => t.image_index(),
            // a video's frame, by its index in the video
            ModelError::Prep(PrepOpenError::Prep {
                source: vision_prep::PrepError::VideoFrame { index, .. },
                ..
            }) => Some(*index),
            ModelError::Prep(_) => None,
        }
    }

    /// A tower error of a request of images: the tower's refusal of the input is the image's
    /// ([`ModelError::ImageRefused`]), anything else the tower's.
    pub(crate) fn of_images(e: TowerError) -> ModelError {
        match e.kind() {
            ErrorKind::Input => ModelError::ImageRefused(e),
            _ => ModelError::Tower(e),
        }
    }
}

impl Classify for ModelError {
    fn kind(&self) -> ErrorKind {
        match self {
            ModelError::Tower(t) => t.kind(),
            ModelError::Prep(p) => p.kind(),
            ModelError::Image { source, .. } => source.kind(),
            ModelError::ImageRefused(_) => ErrorKind::Image,
            ModelError::RowsOffPlan { .. } => ErrorKind::Internal,
        }
    }
}

impl Model {
    /// Opens the weight file or model directory at `path` for `device`, with the device's own
    /// precision and the default pass ceiling.
    pub fn open(path: &Path, device: Device, settings: PrepSettings) -> Result<Model, ModelError> {
        let options = TowerOptions {
            device,
            ..TowerOptions::default()
        };
        Model::open_with(path, &options, settings)
    }

    /// Opens the weight file or model directory at `path` with the tower `options` (device,
    /// precision, patches per pass) and the processor `settings`.
    pub fn open_with(
        path: &Path,
        options: &TowerOptions,
        settings: PrepSettings,
    ) -> Result<Model, ModelError> {
        let file = WeightFile::open(path).map_err(|e| ModelError::Tower(TowerError::Open(e)))?;
        let pre = preprocessor_for(path, &file, settings)?;
        let lm = lm_attention(&file);
        let tower = Tower::open_with(path, options)?;
        Ok(Model {
            path: path.to_path_buf(),
            pre,
            tower,
            lm,
        })
    }

    /// The family.
    pub fn family(&self) -> Family {
        self.tower.family()
    }

    /// The device its tower runs on (never [`Device::Auto`]: what `auto` chose).
    pub fn device(&self) -> Device {
        self.tower.device()
    }

    /// Its tower's arithmetic.
    pub fn precision(&self) -> Precision {
        self.tower.precision()
    }

    /// Why `auto` runs this model on the CPU although a CUDA device is present
    /// ([`Tower::cpu_reason`]); `None` on CUDA and where no device exists.
    pub fn cpu_reason(&self) -> Option<&str> {
        self.tower.cpu_reason()
    }

    /// The GPU tier its tower runs ([`Tower::tier`]); `None` on the CPU.
    pub fn tier(&self) -> Option<&str> {
        self.tower.tier()
    }

    /// The LM attention law for this model's image spans.
    pub fn lm_attention(&self) -> LmAttention {
        self.lm
    }

    /// The preprocessor.
    pub fn preprocessor(&self) -> &Preprocessor {
        &self.pre
    }

    /// The tower.
    pub fn tower(&self) -> &Tower {
        &self.tower
    }

    /// The weight file or directory it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The plan for one image from its header alone (nothing decoded).
    pub fn plan(&self, image: ImageSource<'_>) -> Result<Plan, ModelError> {
        self.pre
            .plan(image)
            .map_err(|source| ModelError::Image { index: 0, source })
    }

    /// The LM width of its rows.
    pub fn width(&self) -> usize {
        self.tower.width()
    }

    /// The most embedding rows one image can give under this model's processor config and
    /// settings (see [`vision_prep::Preprocessor::max_rows`]: exact at the vendor settings,
    /// otherwise an upper bound), for sizing encoder caches and memory profiles.
    pub fn max_rows_per_image(&self) -> u64 {
        self.pre.max_rows_per_image()
    }

    /// Admits, decodes and prepares every image (in parallel), runs them through the tower in
    /// padding-free passes of at most `max_patches_per_pass` patches, and returns each image's
    /// plan and rows (f32, on the host), in request order. A device out-of-memory is an error
    /// ([`ModelError::is_out_of_memory`]) that leaves the model usable.
    pub fn encode(&self, images: &[ImageSource<'_>]) -> Result<Vec<Encoded>, ModelError> {
        let (plans, rows) = self.with_prepared(images, |t, imgs| {
            let rows = t.run(imgs)?;
            let counts = rows
                .per_image
                .iter()
                .map(|r| r.len() / rows.width.max(1))
                .collect();
            Ok((rows, counts))
        })?;
        Ok(plans
            .into_iter()
            .zip(rows.per_image)
            .map(|(plan, r)| Encoded {
                plan,
                rows: r,
                width: rows.width,
            })
            .collect())
    }

    /// [`Model::encode`] with the rows left on the model's CUDA device in `dtype` (the LM's):
    /// one buffer, image after image, written by the tower's projection directly and marked
    /// ready by an event a caller's stream can wait on ([`DeviceRows::wait_on_stream`]). Returns
    /// once the work is queued. A model on the CPU refuses; a 16-bit dtype needs a tower of that
    /// precision ([`crate::rows_dtype_refusal`]).
    pub fn encode_device(
        &self,
        images: &[ImageSource<'_>],
        dtype: RowsDtype,
    ) -> Result<DeviceEncoded, ModelError> {
        let start = Instant::now();
        let mut prepared_at = start;
        let (plans, (rows, mut timings)) = self.with_prepared(images, |t, imgs| {
            prepared_at = Instant::now();
            let r = t.run_device(imgs, Dest::Owned(dtype))?;
            Ok(((r.owned, r.timings), r.rows_per_image))
        })?;
        timings.prepare = prepared_at - start;
        let rows = rows.ok_or_else(|| {
            ModelError::Tower(TowerError::Unsupported("no rows came back".into()))
        })?;
        Ok(DeviceEncoded {
            plans,
            rows,
            timings,
        })
    }

    /// [`Model::encode_device`] into the caller's memory `out` (rows image after image from its
    /// start), ordered with the caller's stream: the tower writes after the work that stream
    /// has queued and the stream waits for the rows. Returns every image's plan once the work is
    /// queued. `out` must hold at least the plans' rows × [`Model::width`] elements.
    pub fn encode_device_into(
        &self,
        images: &[ImageSource<'_>],
        out: &DeviceOut,
    ) -> Result<Vec<Plan>, ModelError> {
        let (plans, ()) = self.with_prepared(images, |t, imgs| {
            let r = t.run_device(imgs, Dest::Caller(out))?;
            Ok(((), r.rows_per_image))
        })?;
        Ok(plans)
    }

    /// Runs the tower on an image processor's tensors (the upstream names and layouts) instead of
    /// image bytes; rows f32 on the host, per image.
    pub fn encode_tensors(&self, tensors: &ProcessorTensors) -> Result<Rows, ModelError> {
        self.tower
            .run(Inputs::Tensors(tensors))
            .map_err(|e| self.tensor_err(e))
    }

    /// [`Model::encode_tensors`] with the rows left on the CUDA device in `dtype`
    /// (see [`Model::encode_device`]).
    pub fn encode_tensors_device(
        &self,
        tensors: &ProcessorTensors,
        dtype: RowsDtype,
    ) -> Result<DeviceRows, ModelError> {
        let r = self
            .tower
            .run_device(Inputs::Tensors(tensors), Dest::Owned(dtype))
            .map_err(|e| self.tensor_err(e))?;
        r.owned
            .ok_or_else(|| ModelError::Tower(TowerError::Unsupported("no rows came back".into())))
    }

    /// [`Model::encode_tensors`] into the caller's memory, ordered with the caller's stream (see
    /// [`Model::encode_device_into`]); returns each image's row count.
    pub fn encode_tensors_into(
        &self,
        tensors: &ProcessorTensors,
        out: &DeviceOut,
    ) -> Result<Vec<usize>, ModelError> {
        self.tower
            .run_device(Inputs::Tensors(tensors), Dest::Caller(out))
            .map(|r: DeviceResult| r.rows_per_image)
            .map_err(|e| self.tensor_err(e))
    }

    fn tensor_err(&self, e: InputError) -> ModelError {
        ModelError::Tower(e.at(Path::new("<processor tensors>")))
    }

    /// Admits, decodes and prepares every image (in parallel), hands the tower inputs to `run`
    /// (which returns its result and each image's row count), checks the counts against the
    /// plans and hands the pixel buffers back to the preprocessor.
    fn with_prepared<R>(
        &self,
        images: &[ImageSource<'_>],
        run: impl FnOnce(&Tower, Inputs<'_>) -> Result<(R, Vec<usize>), InputError>,
    ) -> Result<(Vec<Plan>, R), ModelError> {
        let prepared = images
            .par_iter()
            .enumerate()
            .map(|(index, img)| {
                self.pre
                    .prepare(*img)
                    .map_err(|source| ModelError::Image { index, source })
            })
            .collect::<Result<Vec<Prepared>, ModelError>>()?;
        let (out, counts) = run(&self.tower, Inputs::Prepared(&prepared))
            .map_err(|e| ModelError::of_images(e.at(&self.path)))?;
        let mut plans = Vec::with_capacity(prepared.len());
        for (index, p) in prepared.into_iter().enumerate() {
            let got = counts.get(index).copied().unwrap_or(0);
            if got != p.plan.rows as usize {
                return Err(ModelError::RowsOffPlan {
                    index,
                    got,
                    planned: p.plan.rows as usize,
                });
            }
            plans.push(p.plan.clone());
            // the tower is done with the pixels: the next call writes into these buffers
            self.pre.recycle(p);
        }
        Ok((plans, out))
    }
}

/// The LM attention law of the model's family, as its tower crate reads it from the text config
/// (an mmproj GGUF carries none: causal, the gemma4 default).
fn lm_attention(file: &WeightFile) -> LmAttention {
    let WeightFile::SafeTensors(ck) = file else {
        return LmAttention::Causal;
    };
    match detect_family(file) {
        Some(Family::Gemma4) => tower_gemma::lm_attention(ck.config()),
        Some(Family::Glm5Next | Family::GlmOcr) => tower_glm5::lm_attention(ck.config()),
        Some(Family::Step3p7) => tower_step::lm_attention(ck.config()),
        None => LmAttention::Causal,
    }
}
