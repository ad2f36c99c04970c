//! The tower paths `cargo xtask parity` runs: each family's host reference (and, on a CUDA
//! machine, its device paths) wrapped as a [`Runner`].

use crate::parity_case::{inputs_case, Arith, Case, CaseRunner, Outcome, Runner};
use anyhow::{bail, Context, Result};
use gpu_core::DeviceTower;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use tower_gemma::cuda::{Device, GpuError};
use tower_gemma::{forward_host, GemmaImage, GemmaStages, GemmaTower, GgufActivation};

/// The implemented runner for a (variants, source, precision) slot of the table, if any.
pub fn runner(
    variants: &'static [&'static str],
    source: &'static str,
    precision: Arith,
) -> Option<Box<dyn Runner>> {
    let gemma = variants.iter().all(|v| v.starts_with("gemma4"));
    match (gemma, precision) {
        (true, Arith::HostF32) => Some(Box::new(CaseRunner {
            variants,
            source,
            precision,
            run: move |f: &Path, c: &Case| GemmaHost { variants, source }.run_case(f, c),
        })),
        (true, Arith::Cuda(_)) => Some(Box::new(GemmaCudaRunner {
            host: GemmaHost { variants, source },
            precision,
        })),
        _ => crate::towers_glm::runner(variants, source, precision)
            .or_else(|| crate::towers_step::runner(variants, source, precision)),
    }
}

/// The Gemma-4 host reference on one weight source (`hf`, `gguf-bf16`, `gguf-f16`).
struct GemmaHost {
    variants: &'static [&'static str],
    source: &'static str,
}

impl GemmaHost {
    /// The weight file of this source for a variant's mini repository.
    fn weights(&self, fixtures: &Path, variant: &str) -> Result<PathBuf> {
        let clipped = variant == "gemma4_clipped";
        Ok(match (self.source, clipped) {
            ("hf", _) => fixtures.join("models").join(variant),
            ("gguf-bf16", false) => fixtures.join("models/gemma4_gguf/mmproj-BF16.gguf"),
            ("gguf-bf16", true) => fixtures.join("models/gemma4_gguf/mmproj-clipped-BF16.gguf"),
            ("gguf-f16", false) => fixtures.join("models/gemma4_gguf/mmproj-F16.gguf"),
            (other, _) => bail!("no {other} weights for {variant}"),
        })
    }

    fn open(&self, fixtures: &Path, variant: &str) -> Result<GemmaTower> {
        let path = self.weights(fixtures, variant)?;
        if self.source == "hf" {
            let ck =
                st_reader::Checkpoint::open(&path).with_context(|| path.display().to_string())?;
            Ok(GemmaTower::from_checkpoint(&ck)?)
        } else {
            let g =
                gguf_reader::GgufFile::open(&path).with_context(|| path.display().to_string())?;
            Ok(GemmaTower::from_gguf(&g, GgufActivation::Model)?)
        }
    }

    fn run_case(&self, fixtures: &Path, case: &Case) -> Result<BTreeMap<String, Vec<f64>>> {
        let tower = self.open(fixtures, &case.variant)?;
        gemma_inputs(fixtures, case, |images| {
            let (_, stages) = forward_host(&tower.config, &tower.weights, images, true)?;
            Ok(stage_map(stages.context("stages were requested")?))
        })
    }
}

/// Calls `f` with the case's images (pixel rows and positions; padding rows included).
fn gemma_inputs<T>(
    fixtures: &Path,
    case: &Case,
    f: impl FnOnce(&[GemmaImage<'_>]) -> Result<T>,
) -> Result<T> {
    let inputs = inputs_case(fixtures, case)?;
    let pv = inputs.tensor("pixel_values")?;
    let pos = inputs.tensor("image_position_ids")?;
    let (b, p, d) = match pv.shape[..] {
        [b, p, d] => (b, p, d),
        _ => bail!("pixel_values shape {:?}", pv.shape),
    };
    let pv32: Vec<f32> = pv.data.iter().map(|&v| v as f32).collect();
    let pos64: Vec<i64> = pos.data.iter().map(|&v| v as i64).collect();
    let images: Vec<GemmaImage<'_>> = (0..b)
        .map(|i| GemmaImage {
            patches: &pv32[i * p * d..(i + 1) * p * d],
            positions: &pos64[i * p * 2..(i + 1) * p * 2],
        })
        .collect();
    f(&images)
}

/// The stage activations by the names the fixtures use, in f64.
fn stage_map(s: GemmaStages) -> BTreeMap<String, Vec<f64>> {
    let all = [
        ("patch_embed", s.patch_embed),
        ("block_0", s.block_0),
        ("blocks_out", s.blocks_out),
        ("pooled", s.pooled),
        ("standardized", s.standardized),
        ("rows", s.rows),
    ];
    all.into_iter()
        .map(|(k, v)| (k.to_string(), v.into_iter().map(f64::from).collect()))
        .collect()
}

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

/// The Gemma-4 CUDA path (`cuda-f32`, `cuda-bf16`) on one weight source; "not run" without CUDA,
/// failed when the device does not open.
struct GemmaCudaRunner {
    host: GemmaHost,
    precision: Arith,
}

impl GemmaCudaRunner {
    fn run_case(
        &self,
        dev: Arc<Device>,
        fixtures: &Path,
        case: &Case,
    ) -> Result<BTreeMap<String, Vec<f64>>> {
        let tower = self.host.open(fixtures, &case.variant)?;
        let p = self.precision.precision();
        let mut cuda = tower.to_cuda(dev, p)?;
        gemma_inputs(fixtures, case, |images| {
            let (_, stages) = cuda.encode(images, true)?;
            Ok(stage_map(stages.context("stages were requested")?))
        })
    }
}

impl Runner for GemmaCudaRunner {
    fn source(&self) -> &str {
        self.host.source
    }
    fn precision(&self) -> Arith {
        self.precision
    }
    fn applies(&self, variant: &str) -> bool {
        self.host.variants.contains(&variant)
    }
    fn run(&self, fixtures: &Path, case: &Case) -> Outcome {
        let dev = match shared_device() {
            Ok(d) => d,
            Err(no) => return no.outcome(),
        };
        match self.run_case(dev, fixtures, case) {
            Ok(m) => Outcome::Ran(m),
            Err(e) => Outcome::Error(format!("{e:#}")),
        }
    }
}
