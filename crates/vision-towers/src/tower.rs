//! One type over every family's tower: open a weight file on a device, feed it prepared inputs,
//! get rows. A request is run in passes of at most `max_patches_per_pass` patches each.

use std::path::Path;

use gpu_core::{GraphStats, GraphStatus};
use st_reader::Checkpoint;
use vision_prep::Prepared;

use crate::device_rows::{Dest, DeviceResult};
use crate::engine::{DeviceRun, Inputs, TowerEngine};
use crate::session::{PassMaker, StreamSession};
use crate::tower_error::InputError;
use crate::upload::{load_host, open_device, upload_mapped, Upload};
use crate::{Device, Family, Precision, ProcessorTensors, TowerError, TowerOptions};

/// A loaded tower of any family, on the host or on a CUDA device. `Send + Sync`: share one
/// behind an `Arc`; CUDA passes from several threads take turns on the device.
#[derive(Debug)]
pub struct Tower {
    /// The family's tower where it runs (the facade's one generic engine, behind one `dyn`).
    engine: Box<dyn TowerEngine>,
    device: Device,
    precision: Precision,
    max_patches_per_pass: usize,
    /// The GPU tier the CUDA path runs (gpu-core's table row, e.g. `9.0 Hopper (…)`).
    tier: Option<String>,
    /// Why `auto` runs on the CPU although a CUDA device is present.
    cpu_reason: Option<String>,
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
        let cuda_only = match options.precision {
            Some(p @ (Precision::Bf16 | Precision::F16)) => Some(p),
            Some(Precision::F32) | None => None,
        };
        if let (Device::Cpu, Some(p)) = (options.device, cuda_only) {
            return Err(TowerError::Unsupported(format!(
                "{p} runs on CUDA only; the CPU path is the f32 reference"
            )));
        }
        let explicit = options.device != Device::Auto;
        // Auto falls back to the CPU when no device opens or the CUDA path cannot take the
        // model; a named device makes each of these an error. Where a device exists, the reason
        // is kept on the tower (`cpu_reason`) and reported, never dropped.
        let fallback = |reason: &str| -> Result<(), TowerError> {
            if let Some(p) = cuda_only {
                return Err(TowerError::Unsupported(format!(
                    "{p} runs on CUDA only and device {} could not use one ({reason})",
                    options.device
                )));
            }
            Ok(())
        };
        let host = |cpu_reason: Option<String>| -> Result<Tower, TowerError> {
            let mut t = Tower::on_host(load_host(path)?, options);
            t.cpu_reason = cpu_reason;
            Ok(t)
        };
        // The device first: a missing one is a quick answer, before any weight is read.
        let dev = match options.device {
            Device::Cpu => None,
            Device::Cuda(n) => Some((
                n,
                open_device(n, options.force_tier).map_err(|e| TowerError::NoDevice {
                    device: options.device,
                    reason: e.reason,
                })?,
            )),
            Device::Auto => match open_device(0, options.force_tier) {
                Ok(d) => Some((0, d)),
                Err(e) => {
                    fallback(&e.reason)?;
                    return host(e.device_present.then_some(e.reason));
                }
            },
        };
        let Some((ordinal, dev)) = dev else {
            return host(None);
        };
        let tier = *dev.tier();
        // bf16 needs bf16 tensor cores (8.0+); where the tier has none (Turing), the default is
        // f16 and an explicit bf16 is refused with the advice to use f16 (vLLM does the same), by
        // gpu-core's one rule (its tier table).
        let precision = options.precision.unwrap_or_else(|| dev.default_precision());
        if let Some(why) = dev.precision_refusal(precision) {
            return Err(TowerError::Unsupported(format!(
                "{}: {why}",
                options.device
            )));
        }
        // Straight from the memory-mapped file to the device: no host f32 copy of the model.
        let mut engine = match upload_mapped(path, dev, precision) {
            Ok(engine) => engine,
            Err(Upload::Refused(reason, family)) if !explicit => {
                fallback(&reason)?;
                return host(Some(format!(
                    "{} on cuda:{ordinal}: {reason}",
                    family.name()
                )));
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
        engine.set_graphs(options.graphs);
        Ok(Tower {
            engine,
            device: Device::Cuda(ordinal),
            precision,
            max_patches_per_pass: options.max_patches_per_pass,
            tier: Some(tier.to_string()),
            cpu_reason: None,
        })
    }

    fn on_host(engine: Box<dyn TowerEngine>, options: &TowerOptions) -> Tower {
        Tower {
            engine,
            device: Device::Cpu,
            precision: Precision::F32,
            max_patches_per_pass: options.max_patches_per_pass,
            tier: None,
            cpu_reason: None,
        }
    }

    /// Why `auto` runs this tower on the CPU although a CUDA device is present: the device's
    /// architecture has no tier, the driver is older than CUDA 13 needs, cuBLASLt is missing, a
    /// forced tier cannot run there, or the CUDA path does not take this model. `None` on CUDA,
    /// for an explicit `cpu`, and where this machine has no CUDA driver or no device.
    pub fn cpu_reason(&self) -> Option<&str> {
        self.cpu_reason.as_deref()
    }

    /// The GPU tier the CUDA path runs, as gpu-core's table names it (`9.0 Hopper (H100, H200,
    /// GH200)`, `8.0 Ampere (A100, A30), forced on 9.0`); `None` on the CPU.
    pub fn tier(&self) -> Option<&str> {
        self.tier.as_deref()
    }

    /// The family of this tower.
    pub fn family(&self) -> Family {
        self.engine.family()
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
        self.engine.graph_status()
    }

    /// What the CUDA path's graph cache did so far (`None` on the host).
    pub fn graph_stats(&self) -> Option<GraphStats> {
        self.engine.graph_stats()
    }

    /// The LM width of its rows.
    pub fn width(&self) -> usize {
        self.engine.width()
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
        self.run(Inputs::Tensors(&set)).map_err(|e| e.at(inputs))
    }

    /// Runs the tower on tensors prepared in memory by `vision-prep`.
    pub fn encode_prepared(&self, prepared: &vision_prep::Prepared) -> Result<Rows, TowerError> {
        self.encode_batch(std::slice::from_ref(prepared))
            .map_err(|e| e.at(Path::new("<prepared image>")))
    }

    /// Runs `inputs` in passes of at most `max_patches_per_pass` patches (whole images, in
    /// order) and returns every image's rows in request order.
    pub(crate) fn run(&self, inputs: Inputs<'_>) -> Result<Rows, InputError> {
        Ok(Rows {
            width: self.width(),
            per_image: self.engine.run(inputs, self.max_patches_per_pass)?,
        })
    }

    /// Patches (tower tokens before any merge or pooling) of each image.
    pub(crate) fn patches(&self, inputs: Inputs<'_>) -> Result<Vec<usize>, InputError> {
        self.engine.patches(inputs)
    }

    /// Runs the tower on several prepared images in padding-free passes (one attention segment
    /// per image, per frame pair, or per view).
    pub(crate) fn encode_batch(&self, prepared: &[Prepared]) -> Result<Rows, InputError> {
        self.run(Inputs::Prepared(prepared))
    }

    /// Runs `inputs` on the CUDA device in passes of at most `max_patches_per_pass` patches and
    /// writes every image's rows, in request order, into one buffer: the library's or the
    /// caller's (`dest`). The host is not blocked by the forward.
    pub(crate) fn run_device(
        &self,
        inputs: Inputs<'_>,
        dest: Dest<'_>,
    ) -> Result<DeviceResult, InputError> {
        let run = DeviceRun {
            ceiling: self.max_patches_per_pass,
            precision: self.precision,
            dest,
        };
        self.engine.run_device(inputs, run)
    }

    /// The two ends of a stream of passes (see `session.rs`): the maker for the producer's
    /// thread, the session (on CUDA holding the tower's lock until it drops) for this one.
    pub(crate) fn stream(&self) -> (Box<dyn PassMaker + '_>, Box<dyn StreamSession + '_>) {
        self.engine
            .stream(self.precision, self.max_patches_per_pass)
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
