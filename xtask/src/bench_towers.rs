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
use vision_towers::tower_core::HostTower;

/// What the bench needs from one of our towers: upload a batch once, run the timed span (the
/// forward plus the projection, from device-resident inputs to device-resident rows), read the
/// rows back (every image's rows in order, concatenated).
pub trait BenchTower {
    /// One image's input, borrowed from the case file.
    type Image<'a>
    where
        Self: 'a;
    /// A batch ready to run (a host tower's borrows its images).
    type Batch<'a>
    where
        Self: 'a;
    /// Validates and uploads `images` (not timed).
    fn prepare<'a>(&mut self, images: &[Self::Image<'a>]) -> Result<Self::Batch<'a>>
    where
        Self: 'a;
    /// The timed span.
    fn run(&mut self, batch: &Self::Batch<'_>) -> Result<()>;
    /// The rows of the last [`BenchTower::run`] on `batch`, concatenated.
    fn rows(&mut self, batch: &Self::Batch<'_>) -> Result<Vec<f32>>;
    /// Turns CUDA graphs of the forward on or off (the host towers have none).
    fn set_graphs(&mut self, on: bool);
    /// What the CUDA graph cache did so far (`None` on the host).
    fn graph_stats(&self) -> Option<GraphStats>;
}

impl BenchTower for GemmaCuda {
    type Image<'a> = GemmaImage<'a>;
    type Batch<'a> = GemmaBatch;
    fn prepare<'a>(&mut self, images: &[GemmaImage<'a>]) -> Result<Self::Batch<'a>>
    where
        Self: 'a,
    {
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
    type Batch<'a> = GlmBatch;
    fn prepare<'a>(&mut self, images: &[GlmImage<'a>]) -> Result<Self::Batch<'a>>
    where
        Self: 'a,
    {
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
    type Batch<'a> = StepBatch;
    fn prepare<'a>(&mut self, images: &[StepImage<'a>]) -> Result<Self::Batch<'a>>
    where
        Self: 'a,
    {
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

/// Every family's host reference through tower-core's one [`HostTower`] trait: a batch is the
/// images themselves, `run` the f32 forward.
impl<T> BenchTower for Host<T>
where
    T: HostTower + 'static,
    T::Error: Send + Sync + 'static,
    for<'a> T::Image<'a>: Clone,
{
    type Image<'a> = T::Image<'a>;
    type Batch<'a> = Vec<T::Image<'a>>;
    fn prepare<'a>(&mut self, images: &[T::Image<'a>]) -> Result<Self::Batch<'a>>
    where
        Self: 'a,
    {
        Ok(images.to_vec())
    }
    fn run(&mut self, batch: &Self::Batch<'_>) -> Result<()> {
        self.last = self.tower.encode_rows(batch)?.concat();
        Ok(())
    }
    fn rows(&mut self, _: &Self::Batch<'_>) -> Result<Vec<f32>> {
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
    batch: &T::Batch<'_>,
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

/// A family's tower on `dev` in a 16-bit precision, with the seconds spent and the bytes resident.
pub struct Loaded<T> {
    /// The tower.
    pub tower: T,
    /// Seconds opening the checkpoint and validating it (header, config, census, shapes): the
    /// tensors stay in the memory-mapped file.
    pub load_s: f64,
    /// Seconds converting to 16 bits straight from the memory map into page-locked staging and
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

/// Opens the Gemma-4 HF checkpoint at `dir` mapped and uploads it in `precision` (bf16 or f16).
pub fn gemma_cuda(
    dev: &Arc<Device>,
    dir: &Path,
    precision: tower_gemma::Precision,
) -> Result<Loaded<GemmaCuda>> {
    let (ck, open_s) = timed(|| open(dir))?;
    let ((cfg, w), check_s) = timed(|| Ok(tower_gemma::load_hf_mapped(&ck)?))?;
    let load_s = open_s + check_s;
    let (tower, upload_s) = timed(|| Ok(GemmaCuda::new(dev.clone(), &cfg, &w, precision)?))?;
    drop(w);
    drop(ck);
    Ok(Loaded {
        weight_bytes: tower.weight_bytes(),
        tower,
        load_s,
        upload_s,
    })
}

/// Opens the GLM checkpoint at `dir` mapped and uploads it in `precision` (bf16 or f16).
pub fn glm_cuda(
    dev: &Arc<Device>,
    dir: &Path,
    precision: tower_glm5::Precision,
) -> Result<Loaded<GlmCuda>> {
    let (ck, open_s) = timed(|| open(dir))?;
    let ((cfg, w), check_s) = timed(|| Ok(tower_glm5::load_hf_mapped(&ck)?))?;
    let load_s = open_s + check_s;
    let (tower, upload_s) = timed(|| Ok(GlmCuda::new(dev.clone(), &cfg, &w, precision)?))?;
    drop(w);
    drop(ck);
    Ok(Loaded {
        weight_bytes: tower.weight_bytes(),
        tower,
        load_s,
        upload_s,
    })
}

/// Opens the Step-3.7 checkpoint at `dir` mapped and uploads it in `precision` (bf16 or f16).
pub fn step_cuda(
    dev: &Arc<Device>,
    dir: &Path,
    precision: tower_step::Precision,
) -> Result<Loaded<StepCuda>> {
    let (ck, open_s) = timed(|| open(dir))?;
    let ((cfg, w), check_s) = timed(|| {
        let config = ck
            .config()
            .with_context(|| format!("{}: no config.json", dir.display()))?;
        Ok(tower_step::load_mapped(&ck, config)?)
    })?;
    let load_s = open_s + check_s;
    let (tower, upload_s) = timed(|| Ok(StepCuda::new(dev.clone(), &cfg, &w, precision)?))?;
    drop(w);
    drop(ck);
    Ok(Loaded {
        weight_bytes: tower.weight_bytes(),
        tower,
        load_s,
        upload_s,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workspace_root;

    /// The host side of the bench goes through tower-core's one HostTower trait: its rows are the
    /// upstream processor case's rows within the host f32 bound (glm_ocr fixture, one image).
    #[test]
    fn the_host_bench_tower_gives_the_fixture_rows() {
        let root = workspace_root().join("fixtures");
        let (tower, _) = load_glm(&root.join("models/glm_ocr")).unwrap();
        let case = open(&root.join("outputs/glm_ocr/tiny_20x15.safetensors")).unwrap();
        let pv = f32_tensor(&case, "pixel_values").unwrap();
        let grid = i64_tensor(&case, "image_grid_thw").unwrap();
        let want = f32_tensor(&case, "f32/rows").unwrap();
        let g = |i: usize| usize::try_from(grid.data[i]).unwrap();
        let images = [GlmImage {
            patches: &pv.data,
            grid_thw: [g(0), g(1), g(2)],
        }];
        let mut host = Host::new(tower);
        let batch = BenchTower::prepare(&mut host, &images).unwrap();
        BenchTower::run(&mut host, &batch).unwrap();
        let got = BenchTower::rows(&mut host, &batch).unwrap();
        let e = crate::bench::rel_l2(&got, &want.data);
        assert!(e <= 1e-5, "rel-L2 {e:.2e}");
        assert!(host.graph_stats().is_none());
    }
}
