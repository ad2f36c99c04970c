//! One type over every family's tower: open a weight file, feed it prepared inputs, get rows.

use crate::{detect_family, Error, Family, WeightFile};
use st_reader::Checkpoint;
use std::path::{Path, PathBuf};
use tower_gemma::{GemmaImage, GemmaTower, GgufActivation};
use tower_glm5::{Glm5Tower, GlmImage};
use tower_step::{StepProcessorOutput, StepTower};

/// Where a tower runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// The host reference (f32 values, f64 accumulation).
    Cpu,
    /// An NVIDIA GPU through `gpu-core`.
    Cuda,
}

/// Why a tower could not be opened or run.
#[derive(Debug, thiserror::Error)]
pub enum TowerError {
    /// The weight file could not be opened.
    #[error(transparent)]
    Open(#[from] Error),
    /// The file is not one of the supported families.
    #[error("{path}: no supported vision tower (family not recognised)")]
    UnknownFamily {
        /// The weight file.
        path: PathBuf,
    },
    /// The family is recognised but its tower is not built yet.
    #[error("{path}: the {family} tower is not implemented yet")]
    NotImplemented {
        /// The weight file.
        path: PathBuf,
        /// The family.
        family: &'static str,
    },
    /// The requested device or precision is not available for this tower yet.
    #[error("{0}")]
    Unsupported(String),
    /// The Gemma-4 tower refused the weights or the inputs.
    #[error("{path}: {source}")]
    Gemma {
        /// The weight file.
        path: PathBuf,
        /// What the tower found wrong.
        #[source]
        source: Box<tower_gemma::GemmaError>,
    },
    /// The GLM tower refused the weights or the inputs.
    #[error("{path}: {source}")]
    Glm {
        /// The weight file or inputs.
        path: PathBuf,
        /// What the tower found wrong.
        #[source]
        source: Box<tower_glm5::GlmError>,
    },
    /// The Step tower refused the weights or the inputs.
    #[error("{path}: {source}")]
    Step {
        /// The weight file or inputs.
        path: PathBuf,
        /// What the tower found wrong.
        #[source]
        source: Box<tower_step::StepError>,
    },
    /// A prepared-input file is unreadable or lacks a tensor.
    #[error("{path}: {message}")]
    Inputs {
        /// The prepared-input file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
}

/// A loaded tower of any family.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // one long-lived handle per model; boxing buys nothing
pub enum Tower {
    /// Gemma-4 vision + embedder.
    Gemma4(GemmaTower),
    /// GLM-5.3-Flash or GLM-OCR vision + merger.
    Glm(Glm5Tower),
    /// Step-3.7-Flash perception encoder + projector.
    Step3p7(StepTower),
}

/// Rows for a batch: one `[rows, width]` block per image, in order.
#[derive(Debug, Clone)]
pub struct Rows {
    /// The LM width (columns of every block).
    pub width: usize,
    /// Each image's rows, row-major.
    pub per_image: Vec<Vec<f32>>,
}

impl Tower {
    /// Opens the weight file at `path` and builds its family's tower for `device`.
    pub fn open(path: &Path, device: Device) -> Result<Tower, TowerError> {
        if device == Device::Cuda {
            return Err(TowerError::Unsupported(
                "the CUDA path is not wired into the towers yet; use --device cpu".into(),
            ));
        }
        let file = WeightFile::open(path)?;
        let gemma_err = |source: tower_gemma::GemmaError| TowerError::Gemma {
            path: path.to_path_buf(),
            source: Box::new(source),
        };
        match (detect_family(&file), file) {
            (Some(Family::Gemma4), WeightFile::Gguf(g)) => {
                GemmaTower::from_gguf(&g, GgufActivation::Model)
                    .map(Tower::Gemma4)
                    .map_err(gemma_err)
            }
            (Some(Family::Gemma4), WeightFile::SafeTensors(ck)) => GemmaTower::from_checkpoint(&ck)
                .map(Tower::Gemma4)
                .map_err(gemma_err),
            (Some(Family::Glm5Next | Family::GlmOcr), WeightFile::SafeTensors(ck)) => {
                Glm5Tower::from_checkpoint(&ck)
                    .map(Tower::Glm)
                    .map_err(|source| TowerError::Glm {
                        path: path.to_path_buf(),
                        source: Box::new(source),
                    })
            }
            (Some(Family::Step3p7), WeightFile::SafeTensors(ck)) => StepTower::from_checkpoint(&ck)
                .map(Tower::Step3p7)
                .map_err(|source| TowerError::Step {
                    path: path.to_path_buf(),
                    source: Box::new(source),
                }),
            (Some(f), _) => Err(TowerError::NotImplemented {
                path: path.to_path_buf(),
                family: f.name(),
            }),
            (None, _) => Err(TowerError::UnknownFamily {
                path: path.to_path_buf(),
            }),
        }
    }

    /// The family of this tower.
    pub fn family(&self) -> Family {
        match self {
            Tower::Gemma4(_) => Family::Gemma4,
            Tower::Glm(t) => match t.config.family {
                tower_glm5::GlmFamily::GlmOcr => Family::GlmOcr,
                _ => Family::Glm5Next,
            },
            Tower::Step3p7(_) => Family::Step3p7,
        }
    }

    /// Runs the tower on the processor's tensors as `vtower prep` (= the upstream processor)
    /// writes them, read from a safetensors file.
    pub fn encode_prepared_file(&self, inputs: &Path) -> Result<Rows, TowerError> {
        let bad = |message: String| TowerError::Inputs {
            path: inputs.to_path_buf(),
            message,
        };
        let ck = Checkpoint::open(inputs).map_err(|e| bad(e.to_string()))?;
        let set = InputSet::from_checkpoint(&ck).map_err(bad)?;
        self.encode_inputs(&set).map_err(|e| e.at(inputs))
    }

    /// Runs the tower on tensors prepared in memory by `vision-prep`.
    pub fn encode_prepared(&self, prepared: &vision_prep::Prepared) -> Result<Rows, TowerError> {
        self.encode_batch(std::slice::from_ref(prepared))
            .map_err(|e| e.at(Path::new("<prepared image>")))
    }

    fn encode_inputs(&self, set: &InputSet) -> Result<Rows, InputError> {
        match self {
            Tower::Gemma4(t) => {
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
                let per_image = t.encode_host(&images).map_err(InputError::Gemma)?;
                Ok(Rows {
                    width: t.config.text_hidden,
                    per_image,
                })
            }
            Tower::Glm(t) => {
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
                let images = GlmImage::split(&t.config, pv, &grids).map_err(InputError::Glm)?;
                let per_image = t.encode_host(&images).map_err(InputError::Glm)?;
                Ok(Rows {
                    width: t.config.out_hidden,
                    per_image,
                })
            }
            Tower::Step3p7(t) => {
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
                        usize::try_from(c).map_err(|_| {
                            InputError::Message(format!("num_local_patches {c} is negative"))
                        })
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
                let images = out.images().map_err(InputError::Step)?;
                let rows = t.encode_host(&images).map_err(InputError::Step)?;
                Ok(Rows {
                    width: t.config.text_hidden,
                    per_image: rows.into_iter().map(|r| r.rows).collect(),
                })
            }
        }
    }
}

/// Why prepared inputs could not be encoded (before the file name is attached).
#[derive(Debug)]
pub(crate) enum InputError {
    Message(String),
    Gemma(tower_gemma::GemmaError),
    Glm(tower_glm5::GlmError),
    Step(tower_step::StepError),
}

impl InputError {
    pub(crate) fn at(self, path: &Path) -> TowerError {
        match self {
            InputError::Message(message) => TowerError::Inputs {
                path: path.to_path_buf(),
                message,
            },
            InputError::Gemma(source) => TowerError::Gemma {
                path: path.to_path_buf(),
                source: Box::new(source),
            },
            InputError::Glm(source) => TowerError::Glm {
                path: path.to_path_buf(),
                source: Box::new(source),
            },
            InputError::Step(source) => TowerError::Step {
                path: path.to_path_buf(),
                source: Box::new(source),
            },
        }
    }
}

/// The processor's tensors by upstream name, whatever they were read from.
#[derive(Debug, Default)]
struct InputSet {
    f32s: Vec<(String, Vec<usize>, Vec<f32>)>,
    i64s: Vec<(String, Vec<usize>, Vec<i64>)>,
}

impl InputSet {
    fn from_checkpoint(ck: &Checkpoint) -> Result<InputSet, String> {
        let mut set = InputSet::default();
        for info in ck.tensors() {
            let view = ck
                .tensor(&info.name)
                .ok_or_else(|| format!("tensor {} vanished", info.name))?;
            match view.dtype().as_str() {
                "I64" => {
                    let values = view
                        .bytes()
                        .chunks_exact(8)
                        .map(|c| {
                            i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])
                        })
                        .collect();
                    set.i64s
                        .push((info.name.clone(), view.shape().to_vec(), values));
                }
                "U8" | "BOOL" => {
                    set.i64s.push((
                        info.name.clone(),
                        view.shape().to_vec(),
                        view.bytes().iter().map(|&b| i64::from(b)).collect(),
                    ));
                }
                "F32" | "BF16" | "F16" => {
                    let values = view.to_f32().map_err(|e| e.to_string())?;
                    set.f32s
                        .push((info.name.clone(), view.shape().to_vec(), values));
                }
                _ => {}
            }
        }
        Ok(set)
    }

    fn f32(&self, name: &str) -> Result<(&[f32], &[usize]), InputError> {
        self.f32s
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, s, v)| (v.as_slice(), s.as_slice()))
            .ok_or_else(|| InputError::Message(format!("no float tensor {name}")))
    }

    fn i64(&self, name: &str) -> Result<(&[i64], &[usize]), InputError> {
        self.i64s
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, s, v)| (v.as_slice(), s.as_slice()))
            .ok_or_else(|| InputError::Message(format!("no I64 tensor {name}")))
    }
}
