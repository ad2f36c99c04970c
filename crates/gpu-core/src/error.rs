//! The crate's one error type.
use cudarc::cublaslt::result::CublasError;
use cudarc::driver::{sys::cudaError_enum, DriverError};
use tower_core::{Classify, ErrorKind};

/// Everything a gpu-core call can fail with. Callers match on the variant.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// No CUDA on this machine: the driver library is missing, or the driver reports no device
    /// (or fewer than the ordinal asked for). An installed CUDA stack that fails is never this
    /// variant (see [`GpuError::Unusable`], [`GpuError::Driver`], [`GpuError::Ptx`]).
    #[error("no CUDA device: {0}")]
    NoDevice(String),
    /// The driver reports a device but the CUDA stack around it cannot be used (cuBLASLt
    /// missing, the driver binding panicked).
    #[error("CUDA device present but unusable: {0}")]
    Unusable(String),
    /// A device allocation failed because the device is out of memory.
    #[error("device out of memory allocating {bytes} bytes")]
    OutOfMemory {
        /// The size that was asked for.
        bytes: usize,
    },
    /// Any other CUDA driver error.
    #[error("CUDA driver: {0}")]
    Driver(#[from] DriverError),
    /// A cuBLASLt call failed.
    #[error("cuBLASLt: {0}")]
    CublasLt(#[from] CublasError),
    /// A kernel launch (or the error it left behind) failed.
    #[error("launch of {kernel}: {source}")]
    Launch {
        /// The kernel's entry point name.
        kernel: &'static str,
        /// What the driver said.
        source: DriverError,
    },
    /// An argument's shape, length, stride or alignment does not fit the operation.
    #[error("{op}: {what}")]
    Shape {
        /// The operation that refused the arguments.
        op: &'static str,
        /// What was found against what was expected.
        what: String,
    },
    /// A CUDA graph could not be captured (what the capture or the driver said).
    #[error("CUDA graph capture: {0}")]
    Capture(String),
    /// A staged upload cannot be used: its slot was refilled, or it belongs to another uploader.
    #[error("staged upload: {0}")]
    Staging(String),
    /// The device's architecture has no tier (older than 7.5), or a forced tier is unknown or
    /// cannot run on this card ([`crate::tier`]).
    #[error("GPU tier: {0}")]
    Tier(#[from] crate::tier::TierError),
    /// A PTX module could not be read or loaded.
    #[error("PTX module {module}: {what}")]
    Ptx {
        /// The module (kernels/ptx/<module>.ptx).
        module: &'static str,
        /// What went wrong.
        what: String,
    },
}

/// Result alias for this crate.
pub type Result<T, E = GpuError> = std::result::Result<T, E>;

impl GpuError {
    /// Maps a failed allocation of `bytes` to [`GpuError::OutOfMemory`] when that is the cause.
    pub(crate) fn from_alloc(e: DriverError, bytes: usize) -> Self {
        if e.0 == cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY {
            GpuError::OutOfMemory { bytes }
        } else {
            GpuError::Driver(e)
        }
    }

    /// Whether the device ran out of memory: a failed allocation, or a driver, launch or cuBLASLt
    /// status that says so (`CUDA_ERROR_OUT_OF_MEMORY`, `CUBLAS_STATUS_ALLOC_FAILED`).
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            GpuError::OutOfMemory { .. } => true,
            GpuError::Driver(e) | GpuError::Launch { source: e, .. } => {
                e.0 == cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY
            }
            GpuError::CublasLt(e) => {
                e.0 == cudarc::cublaslt::sys::cublasStatus_t::CUBLAS_STATUS_ALLOC_FAILED
            }
            _ => false,
        }
    }

    pub(crate) fn shape(op: &'static str, what: impl Into<String>) -> Self {
        GpuError::Shape {
            op,
            what: what.into(),
        }
    }
}

impl Classify for GpuError {
    /// No device or an unusable CUDA stack is `NoDevice`; an exhausted device `OutOfMemory`;
    /// every other failure (driver, launch, cuBLASLt, capture, a kernel's shape) `Device`.
    fn kind(&self) -> ErrorKind {
        match self {
            GpuError::NoDevice(_) | GpuError::Unusable(_) | GpuError::Tier(_) => {
                ErrorKind::NoDevice
            }
            e if e.is_out_of_memory() => ErrorKind::OutOfMemory,
            _ => ErrorKind::Device,
        }
    }
}

/// A family tower's CUDA path error: the device failed, the family's own error `F` (the weights
/// or the input are wrong), or a shape the CUDA kernels do not cover. One type for every
/// family (`tower_gemma::CudaError` is `CudaError<GemmaError>`), so the facade maps it once.
#[derive(Debug, thiserror::Error)]
pub enum CudaError<F: std::error::Error + 'static> {
    /// The device or a kernel launch failed (includes [`GpuError::NoDevice`]).
    #[error(transparent)]
    Gpu(#[from] GpuError),
    /// The family's tower refused its weights or its input.
    #[error(transparent)]
    Family(F),
    /// A shape the CUDA kernels cannot run (e.g. a head dim over 96).
    #[error("unsupported on the CUDA path: {0}")]
    Unsupported(String),
}

impl<F: std::error::Error + Classify + 'static> Classify for CudaError<F> {
    fn kind(&self) -> ErrorKind {
        match self {
            CudaError::Gpu(e) => e.kind(),
            CudaError::Family(e) => e.kind(),
            CudaError::Unsupported(_) => ErrorKind::Unsupported,
        }
    }
}

/// A family tower's error type, written once: the variants every family shares (no vision
/// weights, a config value, a missing, misshapen or unknown tensor, the input), its weight
/// readers' errors (`readers { … }`, each transparent and converted by `?`), the family's own
/// (`{ … }`), the conversion of a [`tower_core::ConfigError`] into its `Config` variant, its kind (`Input` is the input's fault,
/// every other variant the weight file's or its configs') and the conversion into
/// [`CudaError`]`<Family>` that the CUDA path's `?` uses (a generic `From<F>` would overlap
/// `From<GpuError>`). The expansion derives `thiserror::Error`: the family crate depends on
/// thiserror.
///
/// ```ignore
/// gpu_core::family_error! {
///     /// Everything that can go wrong loading or running the Gemma-4 tower.
///     GemmaError, "Gemma-4",
///     readers {
///         /// The GGUF reader refused a tensor.
///         Gguf(gguf_reader::GgufError),
///     }
///     {}
/// }
/// ```
#[macro_export]
macro_rules! family_error {
    (
        $(#[$doc:meta])* $family:ident, $name:literal,
        readers { $($(#[$rdoc:meta])* $reader:ident($rty:ty),)* }
        { $($own:tt)* }
    ) => {
        $(#[$doc])*
        #[derive(Debug, thiserror::Error)]
        pub enum $family {
            #[doc = concat!("The weight file has no ", $name, " vision tower (another family, or a text-only release).")]
            #[error("no {family} vision weights: {0}", family = $name)]
            NoVisionWeights(String),
            /// A config value is missing, of the wrong type, out of range, or disagrees with the
            /// tensors.
            #[error("config: {0}")]
            Config(String),
            /// A tensor the tower needs is absent.
            #[error("missing tensor {0}")]
            MissingTensor(String),
            /// A tensor has a shape other than the config implies.
            #[error("tensor {name}: shape {found:?}, expected {expected:?}")]
            Shape {
                /// The tensor.
                name: String,
                /// Its shape in the file (outermost first).
                found: Vec<usize>,
                /// The shape the config implies.
                expected: Vec<usize>,
            },
            /// The weight file holds a vision tensor this tower does not know; it is refused,
            /// never ignored.
            #[error("unknown vision tensor {0} (this tower does not know what to do with it)")]
            UnknownTensor(String),
            $(
                $(#[$rdoc])*
                #[error(transparent)]
                $reader(#[from] $rty),
            )*
            $($own)*
            /// The input is inconsistent with itself or the config (row width, positions, grid,
            /// views).
            #[error("input: {0}")]
            Input(String),
        }

        impl $crate::tower_core::Classify for $family {
            fn kind(&self) -> $crate::tower_core::ErrorKind {
                match self {
                    $family::Input(_) => $crate::tower_core::ErrorKind::Input,
                    _ => $crate::tower_core::ErrorKind::Weights,
                }
            }
        }

        impl From<$crate::tower_core::ConfigError> for $family {
            fn from(e: $crate::tower_core::ConfigError) -> Self {
                $family::Config(e.to_string())
            }
        }

        impl From<$family> for $crate::CudaError<$family> {
            fn from(e: $family) -> Self {
                $crate::CudaError::Family(e)
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudarc::cublaslt::sys::cublasStatus_t;

    #[test]
    fn out_of_memory_is_recognised_by_status_not_text() {
        let oom = DriverError(cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY);
        let other = DriverError(cudaError_enum::CUDA_ERROR_INVALID_VALUE);
        assert!(GpuError::OutOfMemory { bytes: 1 }.is_out_of_memory());
        assert!(GpuError::Driver(oom).is_out_of_memory());
        assert!(GpuError::Launch {
            kernel: "k",
            source: oom
        }
        .is_out_of_memory());
        assert!(
            GpuError::CublasLt(CublasError(cublasStatus_t::CUBLAS_STATUS_ALLOC_FAILED))
                .is_out_of_memory()
        );
        assert!(!GpuError::Driver(other).is_out_of_memory());
        assert!(!GpuError::Launch {
            kernel: "k",
            source: other
        }
        .is_out_of_memory());
        assert!(
            !GpuError::CublasLt(CublasError(cublasStatus_t::CUBLAS_STATUS_EXECUTION_FAILED))
                .is_out_of_memory()
        );
        assert!(!GpuError::shape("op", "out of memory").is_out_of_memory());
        assert!(!GpuError::NoDevice("OUT_OF_MEMORY".into()).is_out_of_memory());
    }
}
