//! How a tower is opened: the device, the arithmetic, the pass ceiling, graphs.

use std::fmt;
use std::str::FromStr;

pub use tower_core::Precision;

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

/// The default ceiling on patches (tower tokens before any merge or pooling) in one pass: above
/// the largest single image any supported processor emits by default (GLM-OCR: 60 000).
pub const DEFAULT_MAX_PATCHES_PER_PASS: usize = 65_536;

/// How a tower is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TowerOptions {
    /// Where it runs.
    pub device: Device,
    /// Its arithmetic; `None` takes the device's own: f32 on the CPU, bf16 on CUDA (f16 on a
    /// tier without bf16 tensor cores: Turing, 7.5).
    pub precision: Option<Precision>,
    /// The most patches one pass holds: a request over it runs in several passes (whole images
    /// each, in order), which bounds activation memory; one image over it is refused.
    pub max_patches_per_pass: usize,
    /// On CUDA in bf16 or f16: replay CUDA graphs for batch layouts seen before (on by default; the graph
    /// GPU tests, `tests/graphs.rs`, passed on an H200 on 2026-12-01: docs/notes/throughput.md).
    pub graphs: bool,
    /// On CUDA: run an older GPU tier on this card (its compute capability, e.g. `(8, 0)`;
    /// [`gpu_core::parse_tier`] reads `8.0` / `sm80`): that tier's code, limits and kernels — a
    /// test of code paths, not of speed. `None`: the card's own tier, or the one
    /// `GPU_CORE_FORCE_TIER` names (docs/TIERS.md).
    pub force_tier: Option<(u32, u32)>,
}

impl Default for TowerOptions {
    fn default() -> TowerOptions {
        TowerOptions {
            device: Device::Auto,
            precision: None,
            max_patches_per_pass: DEFAULT_MAX_PATCHES_PER_PASS,
            graphs: true,
            force_tier: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
