//! Putting a weight file's tower where it runs: the host load, the CUDA device probe, and the
//! upload straight from the memory map, each written once over the families ([`TowerFamily`]);
//! the file's detected family picks the type here, the one place the facade names them.

use std::path::Path;
use std::sync::Arc;

// gpu-core's CUDA context; the facade's public `Device` is where a tower runs (Auto/Cpu/Cuda(N)).
use gpu_core::Device as CudaDevice;
use gpu_core::{CudaError, GpuError};
use tower_core::FamilyError;

use crate::engine::{Engine, TowerEngine};
use crate::families::{Gemma4, Glm, Step3p7, TowerFamily};
use crate::{detect_family, Family, Precision, TowerError, WeightFile};

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
    CudaDevice::with_options(
        ordinal,
        &gpu_core::DeviceOptions {
            force_tier,
            ..gpu_core::DeviceOptions::default()
        },
    )
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
) -> Result<Box<dyn TowerEngine>, Upload> {
    let file = WeightFile::open(path).map_err(|e| Upload::Failed(e.into()))?;
    let uploaded = match detect_family(&file) {
        Some(f @ Family::Gemma4) => upload::<Gemma4>(path, &file, dev, precision, f),
        Some(f @ (Family::Glm5Next | Family::GlmOcr)) => {
            upload::<Glm>(path, &file, dev, precision, f)
        }
        Some(f @ Family::Step3p7) => upload::<Step3p7>(path, &file, dev, precision, f),
        None => None,
    };
    // The host loader gives the other files their own answer (not implemented, unknown family).
    uploaded.unwrap_or_else(|| {
        load_host(path)
            .and_then(|_| {
                Err(TowerError::Unsupported(format!(
                    "{}: no CUDA path for this file",
                    path.display()
                )))
            })
            .map_err(Upload::Failed)
    })
}

/// A family's CUDA engine of `file` (`None` for a file kind it has no CUDA loader for).
fn upload<F: TowerFamily>(
    path: &Path,
    file: &WeightFile,
    dev: Arc<CudaDevice>,
    precision: Precision,
    family: Family,
) -> Option<Result<Box<dyn TowerEngine>, Upload>> {
    let engine = |t: F::Cuda| Box::new(Engine::<F>::cuda(t)) as Box<dyn TowerEngine>;
    Some(
        F::upload(file, dev, precision)?
            .map(engine)
            .map_err(|e| match e {
                CudaError::Gpu(e) if e.is_out_of_memory() => {
                    Upload::Failed(TowerError::OutOfMemory {
                        path: path.to_path_buf(),
                        during: "uploading the weights".into(),
                        source: Box::new(e),
                    })
                }
                CudaError::Gpu(e) => Upload::Failed(TowerError::Gpu {
                    path: path.to_path_buf(),
                    source: Box::new(e),
                }),
                CudaError::Unsupported(m) => {
                    Upload::Refused(format!("unsupported on the CUDA path: {m}"), family)
                }
                CudaError::Family(e) => Upload::Failed(TowerError::Refused {
                    path: path.to_path_buf(),
                    source: FamilyError::new(e),
                }),
            }),
    )
}

/// The host engine of the weight file at `path`.
pub(crate) fn load_host(path: &Path) -> Result<Box<dyn TowerEngine>, TowerError> {
    let file = WeightFile::open(path)?;
    let Some(family) = detect_family(&file) else {
        return Err(TowerError::UnknownFamily {
            path: path.to_path_buf(),
        });
    };
    let loaded = match family {
        Family::Gemma4 => host::<Gemma4>(path, file),
        Family::Glm5Next | Family::GlmOcr => host::<Glm>(path, file),
        Family::Step3p7 => host::<Step3p7>(path, file),
    };
    loaded.unwrap_or_else(|| {
        Err(TowerError::NotImplemented {
            path: path.to_path_buf(),
            family: family.name(),
        })
    })
}

/// A family's host engine of `file` (`None` for a file kind it has no loader for).
fn host<F: TowerFamily>(
    path: &Path,
    file: WeightFile,
) -> Option<Result<Box<dyn TowerEngine>, TowerError>> {
    Some(
        F::load_host(file)?
            .map(|t| Box::new(Engine::<F>::host(t)) as Box<dyn TowerEngine>)
            .map_err(|e| TowerError::Refused {
                path: path.to_path_buf(),
                source: FamilyError::new(e),
            }),
    )
}
