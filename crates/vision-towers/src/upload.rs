//! Putting a weight file's tower where it runs: the host load of each family, the CUDA device
//! probe, and the upload straight from the memory map.

use std::path::Path;
use std::sync::{Arc, Mutex};

// gpu-core's CUDA context; the facade's public `Device` is where a tower runs (Auto/Cpu/Cuda(N)).
use gpu_core::Device as CudaDevice;
use gpu_core::{DeviceTower, GpuError};
use tower_core::FamilyError;
use tower_gemma::{GemmaCuda, GemmaTower, GgufActivation};
use tower_glm5::{GlmCuda, GlmTower};
use tower_step::{StepCuda, StepTower};

use crate::cuda_engine::Cuda;
use crate::engine::Engine;
use crate::{detect_family, Family, Precision, TowerError, WeightFile};

/// The host tower a weight file holds.
#[allow(clippy::large_enum_variant)] // short-lived: becomes an Engine at open
pub(crate) enum LoadedHost {
    Gemma4(GemmaTower),
    Glm(GlmTower),
    Step3p7(StepTower),
}

/// Why a CUDA device did not open.
pub(crate) struct NotOpened {
    /// What gpu-core said (a machine without CUDA gets its reason as text, never a panic).
    pub(crate) reason: String,
    /// Whether a device exists but cannot run the tower (an architecture without a tier, a driver
    /// older than CUDA 13 needs, no cuBLASLt, a forced tier it cannot run): `auto` still runs on
    /// the CPU, but says why. `false`: no CUDA driver or no device here.
    pub(crate) device_present: bool,
}

/// Opens CUDA device `ordinal` on its own tier, or the one `force_tier` (or gpu-core's
/// `GPU_CORE_FORCE_TIER`) names.
pub(crate) fn open_device(
    ordinal: usize,
    force_tier: Option<(u32, u32)>,
) -> Result<Arc<CudaDevice>, NotOpened> {
    CudaDevice::with_options(ordinal, &gpu_core::DeviceOptions { force_tier })
        .map(Arc::new)
        .map_err(|e| NotOpened {
            device_present: !matches!(e, GpuError::NoDevice(_)),
            reason: no_device_reason(&e),
        })
}

fn no_device_reason(e: &GpuError) -> String {
    match e {
        GpuError::NoDevice(why) => why.clone(),
        other => other.to_string(),
    }
}

/// Why a CUDA upload did not give a tower.
pub(crate) enum Upload {
    /// The CUDA path cannot take this model of this family (a shape its kernels do not
    /// cover); `auto` falls back on the host tower.
    Refused(String, Family),
    /// The file, its tower or the device failed (out of memory, driver error).
    Failed(TowerError),
}

/// Opens the weight file at `path` and uploads its tower to `dev` in `precision` straight from
/// the memory map (each family's `from_checkpoint` / `from_gguf`): validated like the host
/// load, but the model is never converted to f32 on the host.
pub(crate) fn upload_mapped(
    path: &Path,
    dev: Arc<CudaDevice>,
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
    let p = precision;
    match (family, &file) {
        (Some(Family::Gemma4), file) => {
            use tower_gemma::CudaError as E;
            let r = match file {
                WeightFile::Gguf(g) => GemmaCuda::from_gguf(dev, g, GgufActivation::Model, p),
                WeightFile::SafeTensors(ck) => GemmaCuda::from_checkpoint(dev, ck, p),
            };
            match r {
                Ok(c) => Ok(Engine::GemmaCuda(Cuda {
                    config: c.config().clone(),
                    cuda: Mutex::new(c),
                })),
                Err(E::Gpu(e)) => Err(failed(e)),
                Err(E::Unsupported(m)) => Err(refused(m, Family::Gemma4)),
                Err(E::Family(e)) => Err(Upload::Failed(TowerError::Refused {
                    path: path.to_path_buf(),
                    source: FamilyError::new(e),
                })),
            }
        }
        (Some(f @ (Family::Glm5Next | Family::GlmOcr)), WeightFile::SafeTensors(ck)) => {
            use tower_glm5::CudaError as E;
            match GlmCuda::from_checkpoint(dev, ck, p) {
                Ok(c) => Ok(Engine::GlmCuda(Cuda {
                    config: c.config().clone(),
                    cuda: Mutex::new(c),
                })),
                Err(E::Gpu(e)) => Err(failed(e)),
                Err(E::Unsupported(m)) => Err(refused(m, f)),
                Err(E::Family(e)) => Err(Upload::Failed(TowerError::Refused {
                    path: path.to_path_buf(),
                    source: FamilyError::new(e),
                })),
            }
        }
        (Some(Family::Step3p7), WeightFile::SafeTensors(ck)) => {
            use tower_step::CudaError as E;
            match StepCuda::from_checkpoint(dev, ck, p) {
                Ok(c) => Ok(Engine::StepCuda(Cuda {
                    config: c.config().clone(),
                    cuda: Mutex::new(c),
                })),
                Err(E::Gpu(e)) => Err(failed(e)),
                Err(E::Unsupported(m)) => Err(refused(m, Family::Step3p7)),
                Err(E::Family(e)) => Err(Upload::Failed(TowerError::Refused {
                    path: path.to_path_buf(),
                    source: FamilyError::new(e),
                })),
            }
        }
        // The host loader gives these files their own answer (not implemented, unknown family).
        _ => LoadedHost::load(path)
            .and_then(|_| {
                Err(TowerError::Unsupported(format!(
                    "{}: no CUDA path for this file",
                    path.display()
                )))
            })
            .map_err(Upload::Failed),
    }
}

impl LoadedHost {
    pub(crate) fn load(path: &Path) -> Result<LoadedHost, TowerError> {
        let file = WeightFile::open(path)?;
        let refused = |source: FamilyError| TowerError::Refused {
            path: path.to_path_buf(),
            source,
        };
        let gemma_err = |e: tower_gemma::GemmaError| refused(FamilyError::new(e));
        match (detect_family(&file), file) {
            (Some(Family::Gemma4), WeightFile::Gguf(g)) => {
                GemmaTower::from_gguf(&g, GgufActivation::Model)
                    .map(LoadedHost::Gemma4)
                    .map_err(gemma_err)
            }
            (Some(Family::Gemma4), WeightFile::SafeTensors(ck)) => GemmaTower::from_checkpoint(&ck)
                .map(LoadedHost::Gemma4)
                .map_err(gemma_err),
            (Some(Family::Glm5Next | Family::GlmOcr), WeightFile::SafeTensors(ck)) => {
                GlmTower::from_checkpoint(&ck)
                    .map(LoadedHost::Glm)
                    .map_err(|e| refused(FamilyError::new(e)))
            }
            (Some(Family::Step3p7), WeightFile::SafeTensors(ck)) => StepTower::from_checkpoint(&ck)
                .map(LoadedHost::Step3p7)
                .map_err(|e| refused(FamilyError::new(e))),
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
