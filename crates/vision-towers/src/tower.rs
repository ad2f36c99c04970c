//! One type over every family's tower: open a weight file on a device, feed it prepared inputs,
//! get rows. A request is run in passes of at most `max_patches_per_pass` patches each.

use crate::{detect_family, Error, Family, ProcessorTensors, WeightFile};
use gpu_core::{GpuError, GraphStats, GraphStatus};
use st_reader::Checkpoint;
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};
use tower_gemma::{GemmaConfig, GemmaCuda, GemmaImage, GemmaTower, GgufActivation};
use tower_glm5::{Glm5Tower, GlmConfig, GlmCuda, GlmImage};
use tower_step::{StepConfig, StepCuda, StepImage, StepTower};

/// Where a tower runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    /// CUDA device 0 when one opens and the tower's CUDA path takes the model (shapes its
    /// kernels cover), else the CPU.
    #[default]
    Auto,
    /// The host reference (f32 values, f64 accumulation).
    Cpu,
    /// The NVIDIA GPU with this ordinal, through `gpu-core`; an error when it does not open.
    Cuda(usize),
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Auto => f.write_str("auto"),
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// A device name that is not `auto`, `cpu`, `cuda` or `cuda:N`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown device {0:?}: expected auto, cpu, cuda or cuda:N")]
pub struct ParseDeviceError(String);

impl FromStr for Device {
    type Err = ParseDeviceError;

    /// Parses `auto`, `cpu`, `cuda` (= `cuda:0`) or `cuda:N`.
    fn from_str(s: &str) -> Result<Device, ParseDeviceError> {
        match s {
            "auto" => Ok(Device::Auto),
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| ParseDeviceError(s.to_string())),
        }
    }
}

/// The arithmetic of a tower.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// f32 values: the host reference, or CUDA's exactness mode (f32 GEMMs, no TF32).
    F32,
    /// bf16 weights and GEMM inputs on the tensor cores, f32 accumulation (CUDA only).
    Bf16,
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
        })
    }
}

/// The default ceiling on patches (tower tokens before any merge or pooling) in one pass: above
/// the largest single image any supported processor emits by default (GLM-OCR: 60 000).
pub const DEFAULT_MAX_PATCHES_PER_PASS: usize = 65_536;

/// How a tower is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TowerOptions {
    /// Where it runs.
    pub device: Device,
    /// Its arithmetic; `None` takes the device's own: f32 on the CPU, bf16 on CUDA.
    pub precision: Option<Precision>,
    /// The most patches one pass holds: a request over it runs in several passes (whole images
    /// each, in order), which bounds activation memory; one image over it is refused.
    pub max_patches_per_pass: usize,
    /// On CUDA in bf16: replay CUDA graphs for batch layouts seen before (on by default; the graph
    /// GPU tests, `tests/graphs.rs`, passed on an H200 on 2026-12-01: docs/notes/throughput.md).
    pub graphs: bool,
}

impl Default for TowerOptions {
    fn default() -> TowerOptions {
        TowerOptions {
            device: Device::Auto,
            precision: None,
            max_patches_per_pass: DEFAULT_MAX_PATCHES_PER_PASS,
            graphs: true,
        }
    }
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
    /// The requested device, precision or setting is not available for this tower.
    #[error("{0}")]
    Unsupported(String),
    /// A CUDA device was asked for by name and none opens.
    #[error("no usable CUDA device for {device} ({reason})")]
    NoDevice {
        /// The device asked for.
        device: Device,
        /// Why it does not open, as the driver probe says.
        reason: String,
    },
    /// The device ran out of memory (while uploading weights, or inside a pass); after a pass
    /// the tower stays usable for the next call.
    #[error("{path}: CUDA out of memory {during} ({source}); retry with fewer images per call or a lower max_patches_per_pass")]
    OutOfMemory {
        /// The weight file.
        path: PathBuf,
        /// What was running: the weight upload, or a pass of so many patches.
        during: String,
        /// gpu-core's error.
        #[source]
        source: Box<GpuError>,
    },
    /// Any other device failure (driver, launch, cuBLASLt).
    #[error("{path}: {source}")]
    Gpu {
        /// The weight file.
        path: PathBuf,
        /// gpu-core's error.
        #[source]
        source: Box<GpuError>,
    },
    /// One image holds more patches than one pass may.
    #[error("{path}: image {index} has {patches} patches, over the ceiling of {ceiling} per pass (max_patches_per_pass); raise it to encode this image")]
    OverPassCeiling {
        /// The weight file.
        path: PathBuf,
        /// The image's position in the request.
        index: usize,
        /// Its patches.
        patches: usize,
        /// The ceiling.
        ceiling: usize,
    },
    /// A pass of a request split into several failed; image numbers inside `source` count from
    /// the pass's first image.
    #[error("in the pass over images {first}–{last} (numbered from 0 below): {source}")]
    Pass {
        /// The pass's first image in the request.
        first: usize,
        /// Its last image in the request.
        last: usize,
        /// What failed.
        #[source]
        source: Box<TowerError>,
    },
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

impl TowerError {
    /// Whether this is a device out-of-memory error (also inside one pass of several).
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            TowerError::OutOfMemory { .. } => true,
            TowerError::Pass { source, .. } => source.is_out_of_memory(),
            _ => false,
        }
    }
}

/// A loaded tower of any family, on the host or on a CUDA device. `Send + Sync`: share one
/// behind an `Arc`; CUDA passes from several threads take turns on the device.
#[derive(Debug)]
pub struct Tower {
    pub(crate) engine: Engine,
    device: Device,
    precision: Precision,
    max_patches_per_pass: usize,
}

/// The family's weights where they run. A CUDA tower keeps only the config on the host; its
/// `&mut` runs take turns behind the mutex.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // one long-lived handle per model; boxing buys nothing
pub(crate) enum Engine {
    GemmaHost(GemmaTower),
    GemmaCuda {
        config: GemmaConfig,
        cuda: Mutex<GemmaCuda>,
    },
    GlmHost(Glm5Tower),
    GlmCuda {
        config: GlmConfig,
        cuda: Mutex<GlmCuda>,
    },
    StepHost(StepTower),
    StepCuda {
        config: StepConfig,
        cuda: Mutex<StepCuda>,
    },
}

impl Engine {
    /// Turns the CUDA path's graphs on or off (the host paths have none).
    fn with_graphs(mut self, on: bool) -> Engine {
        match &mut self {
            Engine::GemmaCuda { cuda, .. } => cuda
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner)
                .set_graphs(on),
            Engine::GlmCuda { cuda, .. } => cuda
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner)
                .set_graphs(on),
            Engine::StepCuda { cuda, .. } => cuda
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner)
                .set_graphs(on),
            Engine::GemmaHost(_) | Engine::GlmHost(_) | Engine::StepHost(_) => {}
        }
        self
    }
}

/// Rows for a batch: one `[rows, width]` block per image, in order.
#[derive(Debug, Clone)]
pub struct Rows {
    /// The LM width (columns of every block).
    pub width: usize,
    /// Each image's rows, row-major.
    pub per_image: Vec<Vec<f32>>,
}

/// A family's tower inputs for a whole request.
pub(crate) enum Images<'a> {
    Gemma4(Vec<GemmaImage<'a>>),
    Glm(Vec<GlmImage<'a>>),
    Step3p7(Vec<StepImage<'a>>),
}

/// The host tower a weight file holds.
#[allow(clippy::large_enum_variant)] // short-lived: becomes an Engine at open
enum HostTower {
    Gemma4(GemmaTower),
    Glm(Glm5Tower),
    Step3p7(StepTower),
}

impl Tower {
    /// Opens the weight file at `path` for `device`, with the device's own precision and the
    /// default pass ceiling ([`TowerOptions::default`]).
    pub fn open(path: &Path, device: Device) -> Result<Tower, TowerError> {
        Tower::open_with(
            path,
            &TowerOptions {
                device,
                ..TowerOptions::default()
            },
        )
    }

    /// Opens the weight file at `path` as `options` say: loads the family's tower and, for a
    /// CUDA device, uploads its weights there once.
    pub fn open_with(path: &Path, options: &TowerOptions) -> Result<Tower, TowerError> {
        if options.max_patches_per_pass == 0 {
            return Err(TowerError::Unsupported(
                "max_patches_per_pass must be at least 1".into(),
            ));
        }
        if options.device == Device::Cpu && options.precision == Some(Precision::Bf16) {
            return Err(TowerError::Unsupported(
                "bf16 runs on CUDA only; the CPU path is the f32 reference".into(),
            ));
        }
        let explicit = options.device != Device::Auto;
        // Auto falls back to the CPU when no device opens or the CUDA path cannot take the
        // model; a named device makes each of these an error.
        let fallback = |reason: String| -> Result<(), TowerError> {
            if options.precision == Some(Precision::Bf16) {
                return Err(TowerError::Unsupported(format!(
                    "bf16 runs on CUDA only and device {} could not use one ({reason})",
                    options.device
                )));
            }
            Ok(())
        };
        // The device first: a missing one is a quick answer, before any weight is read.
        let dev = match options.device {
            Device::Cpu => None,
            Device::Cuda(n) => Some((
                n,
                open_device(n).map_err(|reason| TowerError::NoDevice {
                    device: options.device,
                    reason,
                })?,
            )),
            Device::Auto => match open_device(0) {
                Ok(d) => Some((0, d)),
                Err(reason) => {
                    fallback(reason)?;
                    None
                }
            },
        };
        let Some((ordinal, dev)) = dev else {
            return Ok(Tower::on_host(HostTower::load(path)?, options));
        };
        let precision = options.precision.unwrap_or(Precision::Bf16);
        // Straight from the memory-mapped file to the device: no host f32 copy of the model.
        let engine = match upload_mapped(path, dev, precision) {
            Ok(engine) => engine,
            Err(Upload::Refused(reason, _)) if !explicit => {
                fallback(reason)?;
                return Ok(Tower::on_host(HostTower::load(path)?, options));
            }
            Err(Upload::Refused(reason, family)) => {
                return Err(TowerError::Unsupported(format!(
                    "{}: {} on {}: {reason}",
                    path.display(),
                    family.name(),
                    options.device
                )))
            }
            Err(Upload::Failed(e)) => return Err(e),
        };
        let engine = engine.with_graphs(options.graphs);
        Ok(Tower {
            engine,
            device: Device::Cuda(ordinal),
            precision,
            max_patches_per_pass: options.max_patches_per_pass,
        })
    }

    fn on_host(host: HostTower, options: &TowerOptions) -> Tower {
        Tower {
            engine: match host {
                HostTower::Gemma4(t) => Engine::GemmaHost(t),
                HostTower::Glm(t) => Engine::GlmHost(t),
                HostTower::Step3p7(t) => Engine::StepHost(t),
            },
            device: Device::Cpu,
            precision: Precision::F32,
            max_patches_per_pass: options.max_patches_per_pass,
        }
    }

    /// The family of this tower.
    pub fn family(&self) -> Family {
        match &self.engine {
            Engine::GemmaHost(_) | Engine::GemmaCuda { .. } => Family::Gemma4,
            Engine::GlmHost(Glm5Tower { config, .. }) | Engine::GlmCuda { config, .. } => {
                glm_family(config)
            }
            Engine::StepHost(_) | Engine::StepCuda { .. } => Family::Step3p7,
        }
    }

    /// The device it runs on: [`Device::Cpu`] or [`Device::Cuda`] (never `Auto`).
    pub fn device(&self) -> Device {
        self.device
    }

    /// Its arithmetic.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The most patches one pass holds.
    pub fn max_patches_per_pass(&self) -> usize {
        self.max_patches_per_pass
    }

    /// Whether the CUDA path replays CUDA graphs for repeated batch layouts and, if a capture
    /// failed, why not (`None` on the host). Waits for a pass in progress.
    pub fn graph_status(&self) -> Option<GraphStatus> {
        match &self.engine {
            Engine::GemmaCuda { cuda, .. } => Some(
                cuda.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .graph_status()
                    .clone(),
            ),
            Engine::GlmCuda { cuda, .. } => Some(
                cuda.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .graph_status()
                    .clone(),
            ),
            Engine::StepCuda { cuda, .. } => Some(
                cuda.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .graph_status()
                    .clone(),
            ),
            Engine::GemmaHost(_) | Engine::GlmHost(_) | Engine::StepHost(_) => None,
        }
    }

    /// What the CUDA path's graph cache did so far (`None` on the host).
    pub fn graph_stats(&self) -> Option<GraphStats> {
        match &self.engine {
            Engine::GemmaCuda { cuda, .. } => Some(
                cuda.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .graph_stats(),
            ),
            Engine::GlmCuda { cuda, .. } => Some(
                cuda.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .graph_stats(),
            ),
            Engine::StepCuda { cuda, .. } => Some(
                cuda.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .graph_stats(),
            ),
            Engine::GemmaHost(_) | Engine::GlmHost(_) | Engine::StepHost(_) => None,
        }
    }

    /// The LM width of its rows.
    pub fn width(&self) -> usize {
        match &self.engine {
            Engine::GemmaHost(GemmaTower { config, .. }) | Engine::GemmaCuda { config, .. } => {
                config.text_hidden
            }
            Engine::GlmHost(Glm5Tower { config, .. }) | Engine::GlmCuda { config, .. } => {
                config.out_hidden
            }
            Engine::StepHost(StepTower { config, .. }) | Engine::StepCuda { config, .. } => {
                config.text_hidden
            }
        }
    }

    /// Runs the tower on the processor's tensors as `vtower prep` (= the upstream processor)
    /// writes them, read from a safetensors file.
    pub fn encode_prepared_file(&self, inputs: &Path) -> Result<Rows, TowerError> {
        let bad = |message: String| TowerError::Inputs {
            path: inputs.to_path_buf(),
            message,
        };
        let ck = Checkpoint::open(inputs).map_err(|e| {
            // The reader's message already starts with the file it refused; the variant adds
            // the path itself, so drop the reader's copy of the same path (keep any other).
            let message = e.to_string();
            let prefix = format!("{}: ", inputs.display());
            bad(message
                .strip_prefix(&prefix)
                .map_or_else(|| message.clone(), str::to_owned))
        })?;
        let set = ProcessorTensors::from_checkpoint(&ck).map_err(bad)?;
        self.with_tensor_images(&set, |images| self.run(images))
            .map_err(|e| e.at(inputs))
    }

    /// Runs the tower on tensors prepared in memory by `vision-prep`.
    pub fn encode_prepared(&self, prepared: &vision_prep::Prepared) -> Result<Rows, TowerError> {
        self.encode_batch(std::slice::from_ref(prepared))
            .map_err(|e| e.at(Path::new("<prepared image>")))
    }

    pub(crate) fn glm_config(&self) -> Option<&GlmConfig> {
        match &self.engine {
            Engine::GlmHost(Glm5Tower { config, .. }) | Engine::GlmCuda { config, .. } => {
                Some(config)
            }
            _ => None,
        }
    }

    pub(crate) fn step_config(&self) -> Option<&StepConfig> {
        match &self.engine {
            Engine::StepHost(StepTower { config, .. }) | Engine::StepCuda { config, .. } => {
                Some(config)
            }
            _ => None,
        }
    }

    /// Runs `images` in passes of at most `max_patches_per_pass` patches (whole images, in
    /// order) and returns every image's rows in request order.
    pub(crate) fn run(&self, images: &Images<'_>) -> Result<Rows, InputError> {
        let patches = self.patches(images)?;
        let passes = pass_ranges(&patches, self.max_patches_per_pass)?;
        let split = passes.len() > 1;
        let mut per_image = Vec::with_capacity(patches.len());
        for range in passes {
            let n = patches[range.clone()]
                .iter()
                .fold(0usize, |a, &p| a.saturating_add(p));
            let rows = self.pass(images, range.clone(), n).map_err(|e| {
                if split {
                    InputError::Pass {
                        first: range.start,
                        last: range.end.saturating_sub(1),
                        source: Box::new(e),
                    }
                } else {
                    e
                }
            })?;
            per_image.extend(rows);
        }
        Ok(Rows {
            width: self.width(),
            per_image,
        })
    }

    /// Patches (tower tokens before any merge or pooling) of each image.
    pub(crate) fn patches(&self, images: &Images<'_>) -> Result<Vec<usize>, InputError> {
        Ok(match images {
            Images::Gemma4(v) => v
                .iter()
                .map(|i| {
                    i.positions
                        .chunks_exact(2)
                        .filter(|p| p != &[-1, -1])
                        .count()
                })
                .collect(),
            Images::Glm(v) => v
                .iter()
                .map(|i| {
                    let [t, h, w] = i.grid_thw;
                    t.saturating_mul(h).saturating_mul(w)
                })
                .collect(),
            Images::Step3p7(v) => {
                let ps = self
                    .step_config()
                    .ok_or_else(|| self.wrong_inputs("step3p7"))?
                    .patch
                    .max(1);
                let view =
                    |w: &tower_step::StepView<'_>| (w.height / ps).saturating_mul(w.width / ps);
                v.iter()
                    .map(|i| {
                        i.crops
                            .iter()
                            .fold(view(&i.global), |a, c| a.saturating_add(view(c)))
                    })
                    .collect()
            }
        })
    }

    pub(crate) fn wrong_inputs(&self, what: &str) -> InputError {
        InputError::Message(format!(
            "the {} tower was given {what} inputs",
            self.family().name()
        ))
    }

    /// One pass over `images[range]` (`patches` in all).
    fn pass(
        &self,
        images: &Images<'_>,
        range: Range<usize>,
        patches: usize,
    ) -> Result<Vec<Vec<f32>>, InputError> {
        match (&self.engine, images) {
            (Engine::GemmaHost(t), Images::Gemma4(v)) => {
                t.encode_host(&v[range]).map_err(InputError::Gemma)
            }
            (Engine::GemmaCuda { cuda, .. }, Images::Gemma4(v)) => {
                let mut c = cuda.lock().unwrap_or_else(PoisonError::into_inner);
                let run = |c: &mut GemmaCuda| {
                    let batch = c.prepare(&v[range])?;
                    c.run(&batch, false)?;
                    c.rows(&batch)
                };
                run(&mut c).map_err(|e| gemma_cuda_err(e, patches))
            }
            (Engine::GlmHost(t), Images::Glm(v)) => {
                t.encode_host(&v[range]).map_err(InputError::Glm)
            }
            (Engine::GlmCuda { cuda, .. }, Images::Glm(v)) => {
                let mut c = cuda.lock().unwrap_or_else(PoisonError::into_inner);
                let run = |c: &mut GlmCuda| {
                    let batch = c.prepare(&v[range])?;
                    c.run(&batch, false)?;
                    c.rows(&batch)
                };
                run(&mut c).map_err(|e| glm_cuda_err(e, patches))
            }
            (Engine::StepHost(t), Images::Step3p7(v)) => t
                .encode_host(&v[range])
                .map(|rows| rows.into_iter().map(|r| r.rows).collect())
                .map_err(InputError::Step),
            (Engine::StepCuda { cuda, .. }, Images::Step3p7(v)) => {
                let mut c = cuda.lock().unwrap_or_else(PoisonError::into_inner);
                let run = |c: &mut StepCuda| {
                    let batch = c.prepare(&v[range])?;
                    c.run(&batch, false)?;
                    c.rows(&batch)
                };
                run(&mut c)
                    .map(|rows| rows.into_iter().map(|r| r.rows).collect())
                    .map_err(|e| step_cuda_err(e, patches))
            }
            (_, Images::Gemma4(_)) => Err(self.wrong_inputs("gemma4")),
            (_, Images::Glm(_)) => Err(self.wrong_inputs("glm")),
            (_, Images::Step3p7(_)) => Err(self.wrong_inputs("step3p7")),
        }
    }
}

/// A Gemma-4 CUDA path error in a pass of `patches` patches.
pub(crate) fn gemma_cuda_err(e: tower_gemma::CudaError, patches: usize) -> InputError {
    use tower_gemma::CudaError as E;
    match e {
        E::Gpu(e) => InputError::gpu(e, patches),
        E::Gemma(e) => InputError::Gemma(e),
        E::Unsupported(m) => InputError::Message(m),
    }
}

/// A GLM CUDA path error in a pass of `patches` patches.
pub(crate) fn glm_cuda_err(e: tower_glm5::CudaError, patches: usize) -> InputError {
    use tower_glm5::CudaError as E;
    match e {
        E::Gpu(e) => InputError::gpu(e, patches),
        E::Glm(e) => InputError::Glm(e),
        E::Unsupported(m) => InputError::Message(m),
    }
}

/// A Step-3.7 CUDA path error in a pass of `patches` patches.
pub(crate) fn step_cuda_err(e: tower_step::CudaError, patches: usize) -> InputError {
    use tower_step::CudaError as E;
    match e {
        E::Gpu(e) => InputError::gpu(e, patches),
        E::Step(e) => InputError::Step(e),
        E::Unsupported(m) => InputError::Message(m),
    }
}

fn glm_family(config: &GlmConfig) -> Family {
    match config.family {
        tower_glm5::GlmFamily::GlmOcr => Family::GlmOcr,
        _ => Family::Glm5Next,
    }
}

/// Opens CUDA device `ordinal` (gpu-core's probe first: a machine without CUDA gets its reason as
/// text, never a panic).
fn open_device(ordinal: usize) -> Result<Arc<gpu_core::Device>, String> {
    gpu_core::Device::new(ordinal)
        .map(Arc::new)
        .map_err(|e| no_device_reason(&e))
}

fn no_device_reason(e: &GpuError) -> String {
    match e {
        GpuError::NoDevice(why) => why.clone(),
        other => other.to_string(),
    }
}

/// Why a CUDA upload did not give a tower.
enum Upload {
    /// The CUDA path cannot take this model of this family (a shape its kernels do not
    /// cover); `auto` falls back on the host tower.
    Refused(String, Family),
    /// The file, its tower or the device failed (out of memory, driver error).
    Failed(TowerError),
}

/// Opens the weight file at `path` and uploads its tower to `dev` in `precision` straight from
/// the memory map (each family's `from_checkpoint` / `from_gguf`): validated like the host
/// load, but the model is never converted to f32 on the host.
fn upload_mapped(
    path: &Path,
    dev: Arc<gpu_core::Device>,
    precision: Precision,
) -> Result<Engine, Upload> {
    let file = WeightFile::open(path).map_err(|e| Upload::Failed(e.into()))?;
    let family = detect_family(&file);
    let failed = |e: GpuError| {
        Upload::Failed(if e.is_out_of_memory() {
            TowerError::OutOfMemory {
                path: path.to_path_buf(),
                during: "uploading the weights".into(),
                source: Box::new(e),
            }
        } else {
            TowerError::Gpu {
                path: path.to_path_buf(),
                source: Box::new(e),
            }
        })
    };
    let refused =
        |m: String, f: Family| Upload::Refused(format!("unsupported on the CUDA path: {m}"), f);
    let p = match precision {
        Precision::F32 => gpu_core::CudaPrecision::F32,
        Precision::Bf16 => gpu_core::CudaPrecision::Bf16,
    };
    match (family, &file) {
        (Some(Family::Gemma4), file) => {
            use tower_gemma::CudaError as E;
            let r = match file {
                WeightFile::Gguf(g) => GemmaCuda::from_gguf(dev, g, GgufActivation::Model, p),
                WeightFile::SafeTensors(ck) => GemmaCuda::from_checkpoint(dev, ck, p),
            };
            match r {
                Ok(c) => Ok(Engine::GemmaCuda {
                    config: c.config().clone(),
                    cuda: Mutex::new(c),
                }),
                Err(E::Gpu(e)) => Err(failed(e)),
                Err(E::Unsupported(m)) => Err(refused(m, Family::Gemma4)),
                Err(E::Gemma(e)) => Err(Upload::Failed(TowerError::Gemma {
                    path: path.to_path_buf(),
                    source: Box::new(e),
                })),
            }
        }
        (Some(f @ (Family::Glm5Next | Family::GlmOcr)), WeightFile::SafeTensors(ck)) => {
            use tower_glm5::CudaError as E;
            match GlmCuda::from_checkpoint(dev, ck, p) {
                Ok(c) => Ok(Engine::GlmCuda {
                    config: c.config().clone(),
                    cuda: Mutex::new(c),
                }),
                Err(E::Gpu(e)) => Err(failed(e)),
                Err(E::Unsupported(m)) => Err(refused(m, f)),
                Err(E::Glm(e)) => Err(Upload::Failed(TowerError::Glm {
                    path: path.to_path_buf(),
                    source: Box::new(e),
                })),
            }
        }
        (Some(Family::Step3p7), WeightFile::SafeTensors(ck)) => {
            use tower_step::CudaError as E;
            match StepCuda::from_checkpoint(dev, ck, p) {
                Ok(c) => Ok(Engine::StepCuda {
                    config: c.config().clone(),
                    cuda: Mutex::new(c),
                }),
                Err(E::Gpu(e)) => Err(failed(e)),
                Err(E::Unsupported(m)) => Err(refused(m, Family::Step3p7)),
                Err(E::Step(e)) => Err(Upload::Failed(TowerError::Step {
                    path: path.to_path_buf(),
                    source: Box::new(e),
                })),
            }
        }
        // The host loader gives these files their own answer (not implemented, unknown family).
        _ => HostTower::load(path)
            .and_then(|_| {
                Err(TowerError::Unsupported(format!(
                    "{}: no CUDA path for this file",
                    path.display()
                )))
            })
            .map_err(Upload::Failed),
    }
}

impl HostTower {
    fn load(path: &Path) -> Result<HostTower, TowerError> {
        let file = WeightFile::open(path)?;
        let gemma_err = |source: tower_gemma::GemmaError| TowerError::Gemma {
            path: path.to_path_buf(),
            source: Box::new(source),
        };
        match (detect_family(&file), file) {
            (Some(Family::Gemma4), WeightFile::Gguf(g)) => {
                GemmaTower::from_gguf(&g, GgufActivation::Model)
                    .map(HostTower::Gemma4)
                    .map_err(gemma_err)
            }
            (Some(Family::Gemma4), WeightFile::SafeTensors(ck)) => GemmaTower::from_checkpoint(&ck)
                .map(HostTower::Gemma4)
                .map_err(gemma_err),
            (Some(Family::Glm5Next | Family::GlmOcr), WeightFile::SafeTensors(ck)) => {
                Glm5Tower::from_checkpoint(&ck)
                    .map(HostTower::Glm)
                    .map_err(|source| TowerError::Glm {
                        path: path.to_path_buf(),
                        source: Box::new(source),
                    })
            }
            (Some(Family::Step3p7), WeightFile::SafeTensors(ck)) => StepTower::from_checkpoint(&ck)
                .map(HostTower::Step3p7)
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
}

/// Splits images of `patches` each into consecutive passes of at most `ceiling` patches; one
/// (empty) pass for no images, so the tower gives its own answer.
pub(crate) fn pass_ranges(
    patches: &[usize],
    ceiling: usize,
) -> Result<Vec<Range<usize>>, InputError> {
    let mut passes = Vec::new();
    let (mut start, mut sum) = (0, 0usize);
    for (index, &p) in patches.iter().enumerate() {
        if p > ceiling {
            return Err(InputError::OverCeiling {
                index,
                patches: p,
                ceiling,
            });
        }
        if sum.checked_add(p).is_none_or(|s| s > ceiling) {
            passes.push(start..index);
            (start, sum) = (index, 0);
        }
        sum += p;
    }
    passes.push(start..patches.len());
    Ok(passes)
}

/// Why prepared inputs could not be encoded (before the file name is attached).
#[derive(Debug)]
pub(crate) enum InputError {
    Message(String),
    Gemma(tower_gemma::GemmaError),
    Glm(tower_glm5::GlmError),
    Step(tower_step::StepError),
    OverCeiling {
        index: usize,
        patches: usize,
        ceiling: usize,
    },
    OutOfMemory {
        patches: usize,
        source: GpuError,
    },
    Gpu(GpuError),
    Pass {
        first: usize,
        last: usize,
        source: Box<InputError>,
    },
}

impl InputError {
    pub(crate) fn gpu(e: GpuError, patches: usize) -> InputError {
        if e.is_out_of_memory() {
            InputError::OutOfMemory { patches, source: e }
        } else {
            InputError::Gpu(e)
        }
    }

    pub(crate) fn at(self, path: &Path) -> TowerError {
        let path = path.to_path_buf();
        match self {
            InputError::Message(message) => TowerError::Inputs { path, message },
            InputError::Gemma(source) => TowerError::Gemma {
                path,
                source: Box::new(source),
            },
            InputError::Glm(source) => TowerError::Glm {
                path,
                source: Box::new(source),
            },
            InputError::Step(source) => TowerError::Step {
                path,
                source: Box::new(source),
            },
            InputError::OverCeiling {
                index,
                patches,
                ceiling,
            } => TowerError::OverPassCeiling {
                path,
                index,
                patches,
                ceiling,
            },
            InputError::OutOfMemory { patches, source } => TowerError::OutOfMemory {
                path,
                during: format!("in a pass of {patches} patches"),
                source: Box::new(source),
            },
            InputError::Gpu(source) => TowerError::Gpu {
                path,
                source: Box::new(source),
            },
            InputError::Pass {
                first,
                last,
                source,
            } => TowerError::Pass {
                first,
                last,
                source: Box::new(source.at(&path)),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A prepared-input file the reader refuses is named once, not `x: x: …`.
    #[test]
    fn an_unreadable_inputs_file_is_named_once() {
        let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/glm_ocr");
        let tower = Tower::open(&model, Device::Cpu).expect("fixture tower opens");
        let file = std::env::temp_dir().join(format!("vt-inputs-once-{}.st", std::process::id()));
        std::fs::write(&file, [0xffu8; 16]).expect("temp file");
        let err = tower
            .encode_prepared_file(&file)
            .expect_err("16 bytes of 0xff");
        std::fs::remove_file(&file).ok();
        assert!(matches!(err, TowerError::Inputs { .. }), "{err:?}");
        let text = err.to_string();
        let name = file.display().to_string();
        assert_eq!(text.matches(name.as_str()).count(), 1, "{text}");
    }

    #[test]
    fn device_names_parse_and_print_back() {
        for (text, device) in [
            ("auto", Device::Auto),
            ("cpu", Device::Cpu),
            ("cuda:0", Device::Cuda(0)),
            ("cuda:3", Device::Cuda(3)),
        ] {
            assert_eq!(text.parse::<Device>(), Ok(device));
            assert_eq!(device.to_string(), text);
        }
        assert_eq!("cuda".parse::<Device>(), Ok(Device::Cuda(0)));
        for bad in ["", "gpu", "cuda:", "cuda:-1", "cuda:x", "CPU", "cuda0"] {
            assert!(bad.parse::<Device>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn passes_hold_whole_images_in_order_under_the_ceiling() {
        let r = |p: &[usize], c| match pass_ranges(p, c) {
            Ok(v) => Ok(v.into_iter().map(|r| (r.start, r.end)).collect::<Vec<_>>()),
            Err(e) => Err(format!("{e:?}")),
        };
        assert_eq!(r(&[], 10), Ok(vec![(0, 0)]));
        assert_eq!(r(&[4, 4, 2], 10), Ok(vec![(0, 3)]));
        assert_eq!(r(&[4, 4, 3], 10), Ok(vec![(0, 2), (2, 3)]));
        assert_eq!(r(&[10, 1, 9, 10], 10), Ok(vec![(0, 1), (1, 3), (3, 4)]));
        assert_eq!(r(&[1, 1, 1], 1), Ok(vec![(0, 1), (1, 2), (2, 3)]));
        assert!(matches!(
            pass_ranges(&[3, 11, 2], 10),
            Err(InputError::OverCeiling {
                index: 1,
                patches: 11,
                ceiling: 10
            })
        ));
        assert_eq!(r(&[usize::MAX, 1], usize::MAX), Ok(vec![(0, 1), (1, 2)]));
    }

    #[test]
    fn out_of_memory_is_recognised_through_a_pass() {
        let oom = TowerError::OutOfMemory {
            path: "m".into(),
            during: "in a pass of 9 patches".into(),
            source: Box::new(GpuError::OutOfMemory { bytes: 1 }),
        };
        assert!(oom.is_out_of_memory());
        let wrapped = TowerError::Pass {
            first: 2,
            last: 3,
            source: Box::new(oom),
        };
        assert!(wrapped.is_out_of_memory());
        assert!(!TowerError::Unsupported("x".into()).is_out_of_memory());
        assert!(GpuError::OutOfMemory { bytes: 1 }.is_out_of_memory());
        assert!(!GpuError::NoDevice("none".into()).is_out_of_memory());
    }

    #[test]
    fn a_named_cuda_device_that_does_not_open_is_an_error_and_cpu_never_needs_one() {
        let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/gemma4");
        let cpu = Tower::open(&model, Device::Cpu).map_err(|e| e.to_string());
        assert_eq!(cpu.as_ref().map(Tower::device), Ok(Device::Cpu));
        if gpu_core::is_available() {
            return;
        }
        match Tower::open(&model, Device::Cuda(0)) {
            Err(TowerError::NoDevice { device, reason }) => {
                assert_eq!(device, Device::Cuda(0));
                assert!(!reason.is_empty());
            }
            other => panic!("expected NoDevice, got {other:?}"),
        }
        let auto = Tower::open(&model, Device::Auto).map_err(|e| e.to_string());
        assert_eq!(auto.as_ref().map(Tower::device), Ok(Device::Cpu));
        assert_eq!(auto.as_ref().map(Tower::precision), Ok(Precision::F32));
    }
}
