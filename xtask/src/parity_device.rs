//! The one CUDA device every parity runner shares (gemma, glm and step alike), and why it may be
//! missing: below the tower runners (`towers*.rs`) and the table (`parity.rs`), so neither imports
//! the other for it.

use crate::parity_case::Outcome;
use std::sync::{Arc, OnceLock};
use tower_gemma::cuda::{Device, GpuError};

/// Set (to anything) to make xtask act as if this machine had a GPU: `parity` then requires
/// every CUDA row to run (as `--require-cuda`), and opening the device first reads every PTX
/// module as [`Device::new`] would (`GPU_CORE_PTX_DIR` honoured), so a broken PTX directory
/// fails the way it fails on a GPU machine. For checking the checks on a machine without CUDA.
pub(crate) const SIMULATE_GPU_ENV: &str = "XTASK_SIMULATE_GPU";

fn simulate_gpu() -> bool {
    std::env::var_os(SIMULATE_GPU_ENV).is_some()
}

/// Whether this machine has a GPU: the CUDA driver loads and reports at least one device (or
/// [`SIMULATE_GPU_ENV`] is set). Where it does, a CUDA parity row that does not run is a failure.
pub(crate) fn gpu_present() -> bool {
    simulate_gpu() || matches!(gpu_core::device_count(), Ok(n) if n > 0)
}

/// Why the shared CUDA device is not there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum NoCuda {
    /// No CUDA on this machine at all (no driver library, or the driver reports no device): the
    /// CUDA rows are "not run".
    Absent(String),
    /// A CUDA stack is installed but device 0 did not open (a context, PTX or cuBLASLt error):
    /// every CUDA row fails with this reason.
    Broken(String),
}

impl std::fmt::Display for NoCuda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoCuda::Absent(why) => write!(f, "no device: {why}"),
            NoCuda::Broken(why) => write!(f, "CUDA device 0 failed to open: {why}"),
        }
    }
}

impl NoCuda {
    /// The parity outcome of a CUDA path that has no device for this reason.
    pub(crate) fn outcome(&self) -> Outcome {
        match self {
            NoCuda::Absent(_) => Outcome::NoDevice(self.to_string()),
            NoCuda::Broken(_) => Outcome::Error(self.to_string()),
        }
    }
}

/// What opening device 0 gave, sorted: only gpu-core's [`GpuError::NoDevice`] (no CUDA here)
/// is an absent device; every other error is a broken one.
pub(crate) fn classify(opened: Result<Device, GpuError>) -> Result<Arc<Device>, NoCuda> {
    match opened {
        Ok(d) => Ok(Arc::new(d)),
        Err(GpuError::NoDevice(why)) => Err(NoCuda::Absent(why)),
        Err(e) => Err(NoCuda::Broken(e.to_string())),
    }
}

/// [`Device::new`]`(0)`; under [`SIMULATE_GPU_ENV`], every module image is prepared first, as on a
/// GPU machine.
fn open_device0() -> Result<Device, GpuError> {
    if simulate_gpu() {
        for m in gpu_core::Module::ALL {
            for code in [
                gpu_core::tier::CodeSet::Sm90,
                gpu_core::tier::CodeSet::Sm80,
                gpu_core::tier::CodeSet::Sm75,
            ] {
                gpu_core::kernels::module_images(m, code)?;
            }
        }
    }
    Device::new(0)
}

/// One CUDA device for every CUDA runner of the process (gemma, glm and step alike), opened on
/// first use; where there is none, whether CUDA is absent or broken, and why.
pub(crate) fn shared_device() -> Result<Arc<Device>, NoCuda> {
    static DEV: OnceLock<Result<Arc<Device>, NoCuda>> = OnceLock::new();
    DEV.get_or_init(|| classify(open_device0())).clone()
}
