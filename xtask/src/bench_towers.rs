//! The bench's view of our towers: one trait over the CUDA paths (and the host references, for
//! the plumbing test without a GPU), and the case files the PyTorch side wrote (inputs, rows).

use anyhow::{bail, Context, Result};
use std::path::Path;
use std::sync::Arc;

use gpu_core::{Device, DeviceTower, GpuError, GraphStats};
use st_reader::{Checkpoint, Dtype};
use tower_gemma::{GemmaBatch, GemmaCuda, GemmaImage, GemmaTower};
use tower_glm5::{GlmBatch, GlmCuda, GlmImage, GlmTower};
use tower_step::{StepBatch, StepCuda, StepImage, StepTower, StepView};

/// What the bench needs from one of our towers: upload a batch once, run the timed span (the
/// forward plus the projection, from device-resident inputs to device-resident rows), read the
/// rows back (every image's rows in order, concatenated).
pub trait BenchTower {
    /// One image's input, borrowed from the case file.
    type Image<'a>;
    /// A batch ready to run.
    type Batch;
    /// Validates and uploads `images` (not timed).
    fn prepare(&mut self, images: &[Self::Image<'_>]) -> Result<Self::Batch>;
    /// The timed span.
    fn run(&mut self, batch: &Self::Batch) -> Result<()>;
    /// The rows of the last [`BenchTower::run`] on `batch`, concatenated.
    fn rows(&mut self, batch: &Self::Batch) -> Result<Vec<f32>>;
    /// Turns CUDA graphs of the forward on or off (the host towers have none).
    fn set_graphs(&mut self, on: bool);
    /// What the CUDA graph cache did so far (`None` on the host).
    fn graph_stats(&self) -> Option<GraphStats>;
}

impl BenchTower for GemmaCuda {
    type Image<'a> = GemmaImage<'a>;
    type Batch = GemmaBatch;
    fn prepare(&mut self, images: &[GemmaImage<'_>]) -> Result<GemmaBatch> {
        Ok(DeviceTower::prepare(self, images)?)
    }
    fn run(&mut self, batch: &GemmaBatch) -> Result<()> {
        DeviceTower::run(self, batch, false)?;
        Ok(())
    }
    fn rows(&mut self, batch: &GemmaBatch) -> Result<Vec<f32>> {
        Ok(DeviceTower::rows(self, batch)?.concat())
    }
    fn set_graphs(&mut self, on: bool) {
        DeviceTower::set_graphs(self, on)
    }
    fn graph_stats(&self) -> Option<GraphStats> {
        Some(DeviceTower::graph_stats(self))
    }
}

impl BenchTower for GlmCuda {
    type Image<'a> = GlmImage<'a>;
    type Batch = GlmBatch;
    fn prepare(&mut self, images: &[GlmImage<'_>]) -> Result<GlmBatch> {
        Ok(DeviceTower::prepare(self, images)?)
    }
    fn run(&mut self, batch: &GlmBatch) -> Result<()> {
        DeviceTower::run(self, batch, false)?;
        Ok(())
    }
    fn rows(&mut self, batch: &GlmBatch) -> Result<Vec<f32>> {
        Ok(DeviceTower::rows(self, batch)?.concat())
    }
    fn set_graphs(&mut self, on: bool) {
        DeviceTower::set_graphs(self, on)
    }
    fn graph_stats(&self) -> Option<GraphStats> {
        Some(DeviceTower::graph_stats(self))
    }
}

impl BenchTower for StepCuda {
    type Image<'a> = StepImage<'a>;
    type Batch = StepBatch;
    fn prepare(&mut self, images: &[StepImage<'_>]) -> Result<StepBatch> {
        Ok(DeviceTower::prepare(self, images)?)
    }
    fn run(&mut self, batch: &StepBatch) -> Result<()> {
        DeviceTower::run(self, batch, false)?;
        Ok(())
    }
    fn rows(&mut self, batch: &StepBatch) -> Result<Vec<f32>> {
        Ok(DeviceTower::rows(self, batch)?
            .into_iter()
            .flat_map(|r| r.rows)
            .collect())
    }
    fn set_graphs(&mut self, on: bool) {
        DeviceTower::set_graphs(self, on)
    }
    fn graph_stats(&self) -> Option<GraphStats> {
        Some(DeviceTower::graph_stats(self))
    }
}

/// A host reference tower: `run` computes the rows in f32 on the CPU and keeps them.
pub struct Host<T> {
    /// The loaded tower.
    pub tower: T,
    last: Vec<f32>,
}

impl<T> Host<T> {
    /// Wraps a loaded tower.
    pub fn new(tower: T) -> Self {
        Host {
            tower,
            last: Vec::new(),
        }
    }
}

/// Owned copies of the images, for the host towers' batches.
pub struct HostBatch<I>(Vec<I>);

impl BenchTower for Host<GemmaTower> {
    type Image<'a> = GemmaImage<'a>;
    type Batch = HostBatch<(Vec<f32>, Vec<i64>)>;
    fn prepare(&mut self, images: &[GemmaImage<'_>]) -> Result<Self::Batch> {
        Ok(HostBatch(
            images
                .iter()
                .map(|i| (i.patches.to_vec(), i.positions.to_vec()))
                .collect(),
        ))
    }
    fn run(&mut self, batch: &Self::Batch) -> Result<()> {
        let images: Vec<GemmaImage<'_>> = batch
            .0
            .iter()
            .map(|(p, q)| GemmaImage {
                patches: p,
                positions: q,
            })
            .collect();
        self.last = self.tower.encode_host(&images)?.concat();
        Ok(())
    }
    fn rows(&mut self, _: &Self::Batch) -> Result<Vec<f32>> {
        Ok(self.last.clone())
    }
    fn set_graphs(&mut self, _: bool) {}
    fn graph_stats(&self) -> Option<GraphStats> {
        None
    }
}

impl BenchTower for Host<GlmTower> {
    type Image<'a> = GlmImage<'a>;
    type Batch = HostBatch<(Vec<f32>, [usize; 3])>;
    fn prepare(&mut self, images: &[GlmImage<'_>]) -> Result<Self::Batch> {
        Ok(HostBatch(
            images
                .iter()
                .map(|i| (i.patches.to_vec(), i.grid_thw))
                .collect(),
        ))
    }
    fn run(&mut self, batch: &Self::Batch) -> Result<()> {
        let images: Vec<GlmImage<'_>> = batch
            .0
            .iter()
            .map(|(p, g)| GlmImage {
                patches: p,
                grid_thw: *g,
            })
            .collect();
        self.last = self.tower.encode_host(&images)?.concat();
        Ok(())
    }
    fn rows(&mut self, _: &Self::Batch) -> Result<Vec<f32>> {
        Ok(self.last.clone())
    }
    fn set_graphs(&mut self, _: bool) {}
    fn graph_stats(&self) -> Option<GraphStats> {
        None
    }
}

impl BenchTower for Host<StepTower> {
    type Image<'a> = StepImage<'a>;
    type Batch = HostBatch<(Vec<f32>, usize, usize)>;
    fn prepare(&mut self, images: &[StepImage<'_>]) -> Result<Self::Batch> {
        if images.iter().any(|i| !i.crops.is_empty()) {
            bail!("the bench's step cases are single views (no crop tiles)");
        }
        Ok(HostBatch(
            images
                .iter()
                .map(|i| (i.global.pixels.to_vec(), i.global.height, i.global.width))
                .collect(),
        ))
    }
    fn run(&mut self, batch: &Self::Batch) -> Result<()> {
        let images: Vec<StepImage<'_>> = batch
            .0
            .iter()
            .map(|(p, h, w)| StepImage {
                crops: vec![],
                global: StepView {
                    pixels: p,
                    height: *h,
                    width: *w,
                },
                newline_mask: vec![],
            })
            .collect();
        self.last = self
            .tower
            .encode_host(&images)?
            .into_iter()
            .flat_map(|r| r.rows)
            .collect();
        Ok(())
    }
    fn rows(&mut self, _: &Self::Batch) -> Result<Vec<f32>> {
        Ok(self.last.clone())
    }
    fn set_graphs(&mut self, _: bool) {}
    fn graph_stats(&self) -> Option<GraphStats> {
        None
    }
}

/// Times `t.run(batch)`: with CUDA events on `dev` (gpu-core's `time_ms`: `warmup` untimed runs,
/// then `iters` runs each between two events), or with the host clock when `dev` is `None`.
/// Returns the times in ms, sorted.
pub fn time_runs<T: BenchTower>(
    dev: Option<&Device>,
    t: &mut T,
    batch: &T::Batch,
    warmup: usize,
    iters: usize,
) -> Result<Vec<f32>> {
    match dev {
        Some(d) => {
            // time_ms wants gpu-core's error: keep the tower's aside and stop on it.
            let mut failed: Option<anyhow::Error> = None;
            let times = d.time_ms(warmup, iters, || {
                if failed.is_none() {
                    if let Err(e) = t.run(batch) {
                        failed = Some(e);
                    }
                }
                Ok::<(), GpuError>(())
            })?;
            match failed {
                Some(e) => Err(e),
                None => Ok(times),
            }
        }
        None => {
            for _ in 0..warmup {
                t.run(batch)?;
            }
            let mut out = Vec::with_capacity(iters);
            for _ in 0..iters {
                let s = std::time::Instant::now();
                t.run(batch)?;
                out.push((s.elapsed().as_secs_f64() * 1e3) as f32);
            }
            out.sort_by(|a, b| a.total_cmp(b));
            Ok(out)
        }
    }
}

/// A tensor of a case file, as f32 or i64 values with its shape.
pub struct Tensor<T> {
    /// Shape, outermost first.
    pub shape: Vec<usize>,
    /// Values, row-major.
    pub data: Vec<T>,
}

/// Opens a safetensors file the PyTorch side wrote.
pub fn open(path: &Path) -> Result<Checkpoint> {
    Checkpoint::open(path).with_context(|| format!("opening {}", path.display()))
}

/// Tensor `name` of `ck` as f32 (from BF16, F16 or F32).
pub fn f32_tensor(ck: &Checkpoint, name: &str) -> Result<Tensor<f32>> {
    let v = ck
        .tensor(name)
        .with_context(|| format!("{}: no tensor {name}", ck.root().display()))?;
    Ok(Tensor {
        shape: v.shape().to_vec(),
        data: v.to_f32()?,
    })
}

/// Tensor `name` of `ck` as i64 (from I64).
pub fn i64_tensor(ck: &Checkpoint, name: &str) -> Result<Tensor<i64>> {
    let v = ck
        .tensor(name)
        .with_context(|| format!("{}: no tensor {name}", ck.root().display()))?;
    if *v.dtype() != Dtype::I64 {
        bail!(
            "{name}: dtype {} where I64 was expected",
            v.dtype().as_str()
        );
    }
    Ok(Tensor {
        shape: v.shape().to_vec(),
        data: v
            .bytes()
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect(),
    })
}

/// A case's inputs as the PyTorch side saved them, owned.
pub enum Inputs {
    /// `pixel_values [b, n, 3p²]`, `pixel_position_ids [b, n, 2]`.
    Gemma {
        pixels: Tensor<f32>,
        positions: Tensor<i64>,
    },
    /// `hidden_states [Σn, C·T·p²]`, `grid_thw [b, 3]`.
    Glm {
        pixels: Tensor<f32>,
        grid_thw: Tensor<i64>,
    },
    /// `pixel_values [b, 3, S, S]`.
    Step { pixels: Tensor<f32> },
}

impl Inputs {
    /// Reads `path` for `family` (`gemma4`, `glm5_next`, `step3p7`).
    pub fn read(family: &str, path: &Path) -> Result<Inputs> {
        let ck = open(path)?;
        Ok(match family {
            "gemma4" => Inputs::Gemma {
                pixels: f32_tensor(&ck, "pixel_values")?,
                positions: i64_tensor(&ck, "pixel_position_ids")?,
            },
            "glm5_next" => Inputs::Glm {
                pixels: f32_tensor(&ck, "hidden_states")?,
                grid_thw: i64_tensor(&ck, "grid_thw")?,
            },
            "step3p7" => Inputs::Step {
                pixels: f32_tensor(&ck, "pixel_values")?,
            },
            other => bail!("unknown family {other}"),
        })
    }

    /// The Gemma-4 images of the batch.
    pub fn gemma(&self) -> Result<Vec<GemmaImage<'_>>> {
        let Inputs::Gemma { pixels, positions } = self else {
            bail!("not a gemma4 case");
        };
        let [b, n, pd] = pixels.shape[..] else {
            bail!("pixel_values shape {:?}, not [b, n, 3p²]", pixels.shape);
        };
        if positions.shape != [b, n, 2] {
            bail!(
                "pixel_position_ids shape {:?}, not [{b}, {n}, 2]",
                positions.shape
            );
        }
        Ok((0..b)
            .map(|i| GemmaImage {
                patches: &pixels.data[i * n * pd..(i + 1) * n * pd],
                positions: &positions.data[i * n * 2..(i + 1) * n * 2],
            })
            .collect())
    }

    /// The GLM images of the batch (each image's rows in the order `grid_thw` gives).
    pub fn glm(&self) -> Result<Vec<GlmImage<'_>>> {
        let Inputs::Glm { pixels, grid_thw } = self else {
            bail!("not a glm5_next case");
        };
        let [rows, pd] = pixels.shape[..] else {
            bail!("hidden_states shape {:?}, not [Σn, C·T·p²]", pixels.shape);
        };
        let mut out = Vec::new();
        let mut start = 0usize;
        for g in grid_thw.data.chunks_exact(3) {
            let thw = [g[0], g[1], g[2]].map(|v| usize::try_from(v).unwrap_or(0));
            let n = thw[0] * thw[1] * thw[2];
            if start + n > rows {
                bail!(
                    "grid_thw {:?} needs more than the {rows} rows given",
                    grid_thw.data
                );
            }
            out.push(GlmImage {
                patches: &pixels.data[start * pd..(start + n) * pd],
                grid_thw: thw,
            });
            start += n;
        }
        if start != rows {
            bail!("grid_thw covers {start} rows of {rows}");
        }
        Ok(out)
    }

    /// The Step-3.7 views of the batch, each a single global view (no crop tiles).
    pub fn step(&self) -> Result<Vec<StepImage<'_>>> {
        let Inputs::Step { pixels } = self else {
            bail!("not a step3p7 case");
        };
        let [b, 3, h, w] = pixels.shape[..] else {
            bail!("pixel_values shape {:?}, not [b, 3, S, S]", pixels.shape);
        };
        let len = 3 * h * w;
        Ok((0..b)
            .map(|i| StepImage {
                crops: vec![],
                global: StepView {
                    pixels: &pixels.data[i * len..(i + 1) * len],
                    height: h,
                    width: w,
                },
                newline_mask: vec![],
            })
            .collect())
    }
}

/// A family's tower on `dev` in bf16, with the seconds spent and the bytes resident.
pub struct Loaded<T> {
    /// The tower.
    pub tower: T,
    /// Seconds opening the checkpoint and validating it (header, config, census, shapes): the
    /// tensors stay in the memory-mapped file.
    pub load_s: f64,
    /// Seconds converting to bf16 straight from the memory map into page-locked staging and
    /// copying to the device (0 on the host).
    pub upload_s: f64,
    /// Bytes of weights on the device (0 on the host).
    pub weight_bytes: usize,
}

fn timed<T>(f: impl FnOnce() -> Result<T>) -> Result<(T, f64)> {
    let t = std::time::Instant::now();
    let v = f()?;
    Ok((v, t.elapsed().as_secs_f64()))
}

/// Opens the Gemma-4 checkpoint at `dir` into host f32 (the host reference).
pub fn load_gemma(dir: &Path) -> Result<(GemmaTower, f64)> {
    timed(|| {
        let ck = open(dir)?;
        Ok(GemmaTower::from_checkpoint(&ck)?)
    })
}

/// Opens the GLM checkpoint at `dir` into host f32 (the host reference).
pub fn load_glm(dir: &Path) -> Result<(GlmTower, f64)> {
    timed(|| {
        let ck = open(dir)?;
        Ok(GlmTower::from_checkpoint(&ck)?)
    })
}

/// Opens the Step-3.7 checkpoint at `dir` into host f32 (the host reference).
pub fn load_step(dir: &Path) -> Result<(StepTower, f64)> {
    timed(|| {
        let ck = open(dir)?;
        Ok(StepTower::from_checkpoint(&ck)?)
    })
}

/// Opens the Gemma-4 HF checkpoint at `dir` mapped and uploads it in bf16.
pub fn gemma_cuda(dev: &Arc<Device>, dir: &Path) -> Result<Loaded<GemmaCuda>> {
    let (ck, open_s) = timed(|| open(dir))?;
    let ((cfg, w), check_s) = timed(|| Ok(tower_gemma::load_hf_mapped(&ck)?))?;
    let load_s = open_s + check_s;
    let (tower, upload_s) = timed(|| {
        Ok(GemmaCuda::new(
            dev.clone(),
            &cfg,
            &w,
            tower_gemma::Precision::Bf16,
        )?)
    })?;
    drop(w);
    drop(ck);
    Ok(Loaded {
        weight_bytes: tower.weight_bytes(),
        tower,
        load_s,
        upload_s,
    })
}

/// Opens the GLM checkpoint at `dir` mapped and uploads it in bf16.
pub fn glm_cuda(dev: &Arc<Device>, dir: &Path) -> Result<Loaded<GlmCuda>> {
    let (ck, open_s) = timed(|| open(dir))?;
    let ((cfg, w), check_s) = timed(|| Ok(tower_glm5::load_hf_mapped(&ck)?))?;
    let load_s = open_s + check_s;
    let (tower, upload_s) = timed(|| {
        Ok(GlmCuda::new(
            dev.clone(),
            &cfg,
            &w,
            tower_glm5::Precision::Bf16,
        )?)
    })?;
    drop(w);
    drop(ck);
    Ok(Loaded {
        weight_bytes: tower.weight_bytes(),
        tower,
        load_s,
        upload_s,
    })
}

/// Opens the Step-3.7 checkpoint at `dir` mapped and uploads it in bf16.
pub fn step_cuda(dev: &Arc<Device>, dir: &Path) -> Result<Loaded<StepCuda>> {
    let (ck, open_s) = timed(|| open(dir))?;
    let ((cfg, w), check_s) = timed(|| {
        let config = ck
            .config()
            .with_context(|| format!("{}: no config.json", dir.display()))?;
        Ok(tower_step::load_mapped(&ck, config)?)
    })?;
    let load_s = open_s + check_s;
    let (tower, upload_s) = timed(|| {
        Ok(StepCuda::new(
            dev.clone(),
            &cfg,
            &w,
            tower_step::Precision::Bf16,
        )?)
    })?;
    drop(w);
    drop(ck);
    Ok(Loaded {
        weight_bytes: tower.weight_bytes(),
        tower,
        load_s,
        upload_s,
    })
}
