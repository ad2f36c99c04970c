//! Each family's tower as the facade's one generic engine sees it ([`TowerFamily`]): its host
//! and CUDA towers, its typed image, where that image comes from (vision-prep's `Prepared`, an
//! image processor's tensors, a prepared video) and its error. The engine
//! ([`crate::engine::Engine`]) is written once over this trait; a family is one impl here.

use std::fmt::Debug;
use std::sync::Arc;

use gpu_core::{CudaError, Device as CudaDevice, DeviceTower};
use tower_core::{ClassifiedError, GemmaImage, GlmImage, HostTower, StepImage};
use tower_gemma::{GemmaConfig, GemmaCuda, GemmaError, GemmaTower, GgufActivation};
use tower_glm5::{GlmConfig, GlmCuda, GlmError, GlmFamily, GlmTower};
use tower_step::{StepConfig, StepCuda, StepError, StepProcessorOutput, StepTower};
use vision_prep::{Prepared, PreparedVideo};

use crate::tower_error::InputError;
use crate::{Family, Precision, ProcessorTensors, WeightFile};

/// A family's dimensions and laws.
pub(crate) type Config<F> = <<F as TowerFamily>::Cuda as DeviceTower>::Config;
/// One image's tower input of a family (tower-core's typed inputs).
pub(crate) type Image<'a, F> = <<F as TowerFamily>::Cuda as DeviceTower>::Image<'a>;
/// A family's own error (the weights or the input are wrong).
pub(crate) type Error<F> = <<F as TowerFamily>::Cuda as DeviceTower>::Family;

/// What the facade's generic engine needs of a family (see the module docs).
pub(crate) trait TowerFamily: Send + Sync + 'static {
    /// The CUDA tower; its config, image and error types are the family's ([`Config`],
    /// [`Image`], [`Error`]).
    type Cuda: DeviceTower<Config: Clone + Debug + 'static, Family: ClassifiedError, Meta: 'static>
        + Debug
        + 'static;
    /// The host reference tower, over the same images and error.
    type Host: for<'a> HostTower<Image<'a> = Image<'a, Self>, Error = Error<Self>> + Debug;

    /// The name of its inputs in messages (`gemma4`, `glm`, `step3p7`).
    const INPUTS: &'static str;

    /// The family a tower of `config` is.
    fn family(config: &Config<Self>) -> Family;

    /// The host tower's config.
    fn host_config(host: &Self::Host) -> &Config<Self>;

    /// The LM width of its rows.
    fn width(config: &Config<Self>) -> usize;

    /// Patches (tower tokens before any merge or pooling) of one image.
    fn patches(config: &Config<Self>, image: &Image<'_, Self>) -> usize;

    /// The host tower of a weight file this family's; `None` for a file kind the family has no
    /// loader for.
    fn load_host(file: WeightFile) -> Option<Result<Self::Host, Error<Self>>>;

    /// The CUDA tower of a weight file this family's, uploaded from its memory map; `None` for
    /// a file kind the family has no CUDA loader for.
    fn upload(
        file: &WeightFile,
        dev: Arc<CudaDevice>,
        precision: Precision,
    ) -> Option<Result<Self::Cuda, CudaError<Error<Self>>>>;

    /// The image a prepared image holds for this family (`None` when it holds another's).
    fn from_prepared(prepared: &Prepared) -> Option<Image<'_, Self>>;

    /// Hands `f` the images of an image processor's tensors (the upstream names and layouts).
    fn with_tensors<R>(
        config: &Config<Self>,
        set: &ProcessorTensors,
        f: impl FnOnce(&[Image<'_, Self>]) -> Result<R, InputError>,
    ) -> Result<R, InputError>;

    /// The images of a prepared video (`None` when it lacks this family's tensors).
    fn from_video(video: &PreparedVideo) -> Option<Vec<Image<'_, Self>>>;
}

/// Gemma-4.
pub(crate) struct Gemma4;
/// glm5_next and glm_ocr (one program; the config tells them apart).
pub(crate) struct Glm;
/// Step-3.7.
pub(crate) struct Step3p7;

impl TowerFamily for Gemma4 {
    type Cuda = GemmaCuda;
    type Host = GemmaTower;
    const INPUTS: &'static str = "gemma4";

    fn family(_: &GemmaConfig) -> Family {
        Family::Gemma4
    }

    fn host_config(host: &GemmaTower) -> &GemmaConfig {
        &host.config
    }

    fn width(config: &GemmaConfig) -> usize {
        config.text_hidden
    }

    fn patches(_: &GemmaConfig, image: &GemmaImage<'_>) -> usize {
        image.num_patches()
    }

    fn load_host(file: WeightFile) -> Option<Result<GemmaTower, GemmaError>> {
        Some(match file {
            WeightFile::Gguf(g) => GemmaTower::from_gguf(&g, GgufActivation::Model),
            WeightFile::SafeTensors(ck) => GemmaTower::from_checkpoint(&ck),
        })
    }

    fn upload(
        file: &WeightFile,
        dev: Arc<CudaDevice>,
        p: Precision,
    ) -> Option<Result<GemmaCuda, CudaError<GemmaError>>> {
        Some(match file {
            WeightFile::Gguf(g) => GemmaCuda::from_gguf(dev, g, GgufActivation::Model, p),
            WeightFile::SafeTensors(ck) => GemmaCuda::from_checkpoint(dev, ck, p),
        })
    }

    fn from_prepared(prepared: &Prepared) -> Option<GemmaImage<'_>> {
        prepared.gemma4()
    }

    fn with_tensors<R>(
        _: &GemmaConfig,
        set: &ProcessorTensors,
        f: impl FnOnce(&[GemmaImage<'_>]) -> Result<R, InputError>,
    ) -> Result<R, InputError> {
        let (pv, pv_shape) = set.f32("pixel_values")?;
        let (pos, pos_shape) = set.i64("image_position_ids")?;
        let (b, p, d) = match pv_shape[..] {
            [b, p, d] => (b, p, d),
            _ => {
                return Err(InputError::Message(format!(
                    "pixel_values has shape {pv_shape:?}, expected [B, P, 3·p²]"
                )))
            }
        };
        if pos_shape != [b, p, 2] {
            return Err(InputError::Message(format!(
                "image_position_ids has shape {pos_shape:?}, expected [{b}, {p}, 2]"
            )));
        }
        let images: Vec<GemmaImage<'_>> = (0..b)
            .map(|i| GemmaImage {
                patches: &pv[i * p * d..(i + 1) * p * d],
                positions: &pos[i * p * 2..(i + 1) * p * 2],
            })
            .collect();
        f(&images)
    }

    fn from_video(video: &PreparedVideo) -> Option<Vec<GemmaImage<'_>>> {
        video.gemma4_frames()
    }
}

impl TowerFamily for Glm {
    type Cuda = GlmCuda;
    type Host = GlmTower;
    const INPUTS: &'static str = "glm";

    fn family(config: &GlmConfig) -> Family {
        match config.family {
            GlmFamily::GlmOcr => Family::GlmOcr,
            GlmFamily::Glm5Next => Family::Glm5Next,
        }
    }

    fn host_config(host: &GlmTower) -> &GlmConfig {
        &host.config
    }

    fn width(config: &GlmConfig) -> usize {
        config.text_hidden
    }

    fn patches(_: &GlmConfig, image: &GlmImage<'_>) -> usize {
        image.num_patches()
    }

    fn load_host(file: WeightFile) -> Option<Result<GlmTower, GlmError>> {
        match file {
            WeightFile::SafeTensors(ck) => Some(GlmTower::from_checkpoint(&ck)),
            WeightFile::Gguf(_) => None,
        }
    }

    fn upload(
        file: &WeightFile,
        dev: Arc<CudaDevice>,
        p: Precision,
    ) -> Option<Result<GlmCuda, CudaError<GlmError>>> {
        match file {
            WeightFile::SafeTensors(ck) => Some(GlmCuda::from_checkpoint(dev, ck, p)),
            WeightFile::Gguf(_) => None,
        }
    }

    fn from_prepared(prepared: &Prepared) -> Option<GlmImage<'_>> {
        prepared.glm()
    }

    fn with_tensors<R>(
        config: &GlmConfig,
        set: &ProcessorTensors,
        f: impl FnOnce(&[GlmImage<'_>]) -> Result<R, InputError>,
    ) -> Result<R, InputError> {
        let (pv, _) = set.f32("pixel_values")?;
        let (grid, grid_shape) = set.i64("image_grid_thw")?;
        if grid_shape.len() != 2 || grid_shape[1] != 3 {
            return Err(InputError::Message(format!(
                "image_grid_thw has shape {grid_shape:?}, expected [n, 3]"
            )));
        }
        let grids = grid
            .chunks_exact(3)
            .map(|g| {
                let d = |v: i64| {
                    usize::try_from(v)
                        .map_err(|_| InputError::Message(format!("negative grid {g:?}")))
                };
                Ok([d(g[0])?, d(g[1])?, d(g[2])?])
            })
            .collect::<Result<Vec<[usize; 3]>, InputError>>()?;
        let images = tower_glm5::split_images(config, pv, &grids).map_err(InputError::family)?;
        f(&images)
    }

    fn from_video(video: &PreparedVideo) -> Option<Vec<GlmImage<'_>>> {
        Some(vec![video.glm()?])
    }
}

impl TowerFamily for Step3p7 {
    type Cuda = StepCuda;
    type Host = StepTower;
    const INPUTS: &'static str = "step3p7";

    fn family(_: &StepConfig) -> Family {
        Family::Step3p7
    }

    fn host_config(host: &StepTower) -> &StepConfig {
        &host.config
    }

    fn width(config: &StepConfig) -> usize {
        config.text_hidden
    }

    fn patches(config: &StepConfig, image: &StepImage<'_>) -> usize {
        image.num_patches(config.patch)
    }

    fn load_host(file: WeightFile) -> Option<Result<StepTower, StepError>> {
        match file {
            WeightFile::SafeTensors(ck) => Some(StepTower::from_checkpoint(&ck)),
            WeightFile::Gguf(_) => None,
        }
    }

    fn upload(
        file: &WeightFile,
        dev: Arc<CudaDevice>,
        p: Precision,
    ) -> Option<Result<StepCuda, CudaError<StepError>>> {
        match file {
            WeightFile::SafeTensors(ck) => Some(StepCuda::from_checkpoint(dev, ck, p)),
            WeightFile::Gguf(_) => None,
        }
    }

    fn from_prepared(prepared: &Prepared) -> Option<StepImage<'_>> {
        prepared.step3p7()
    }

    fn with_tensors<R>(
        _: &StepConfig,
        set: &ProcessorTensors,
        f: impl FnOnce(&[StepImage<'_>]) -> Result<R, InputError>,
    ) -> Result<R, InputError> {
        let (pv, pv_shape) = set.f32("pixel_values")?;
        let side = match pv_shape[..] {
            [_, 3, s, s2] if s == s2 => s,
            _ => {
                return Err(InputError::Message(format!(
                    "pixel_values has shape {pv_shape:?}, expected [B, 3, S, S]"
                )))
            }
        };
        let (local, local_shape) = set.f32("pixel_values_local").unwrap_or((&[], &[]));
        let local_side = local_shape.get(2).copied().unwrap_or(0);
        let (counts, _) = set.i64("num_local_patches")?;
        let counts = counts
            .iter()
            .map(|&c| {
                usize::try_from(c)
                    .map_err(|_| InputError::Message(format!("num_local_patches {c} is negative")))
            })
            .collect::<Result<Vec<usize>, InputError>>()?;
        let masks: Option<Vec<bool>> = set
            .i64("patch_newline_masks")
            .ok()
            .map(|(m, _)| m.iter().map(|&v| v != 0).collect());
        let out = StepProcessorOutput {
            pixel_values: pv,
            side,
            pixel_values_local: local,
            local_side,
            num_local_patches: &counts,
            patch_newline_masks: masks.as_deref(),
        };
        let images = out.images().map_err(InputError::family)?;
        f(&images)
    }

    fn from_video(_: &PreparedVideo) -> Option<Vec<StepImage<'_>>> {
        None
    }
}
