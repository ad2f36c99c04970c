//! CUDA graphs and pipelined encoding on a CUDA device: for each tower on its fixture model, the
//! rows of a graph replay equal the eager rows bit for bit (on two layouts, and on new values in
//! the same layout), a changed layout is captured anew, a staged (asynchronously uploaded) batch
//! gives the same rows; and `Model::encode_stream` on CUDA gives each image the rows `encode`
//! gives for the same pass.
//!
//! Every test is `#[ignore = "needs a CUDA device"]`; `cargo xtask gpu-test` runs them. Without
//! a device they fail. `VT_FIXTURES` names the fixtures on a machine without this checkout.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use vision_towers::gpu_core::{self, DeviceTower, GraphStats, GraphStatus, Ran};
use vision_towers::tower_gemma::{GemmaCuda, GemmaImage, GemmaTower};
use vision_towers::tower_glm5::{GlmCuda, GlmImage, GlmTower};
use vision_towers::tower_step::{Precision, StepCuda, StepImage, StepTower, StepView};
use vision_towers::vision_prep::{ImageSource, PrepSettings, Prepared};
use vision_towers::{BatchPolicy, Device, Encoded, Model, TowerOptions};

fn fixtures() -> PathBuf {
    std::env::var_os("VT_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures"))
}

fn device() -> Arc<gpu_core::Device> {
    Arc::new(gpu_core::Device::new(0).expect("this test needs a CUDA device"))
}

/// The precisions graphs are captured in: the 16-bit product paths (f32 never captures:
/// `f32_mode_never_captures`).
const GRAPH_PRECISIONS: [Precision; 2] = [Precision::Bf16, Precision::F16];

/// An upload's tower in `p`, or `None` where the device's tier lacks `p` (bf16 on 7.5): there the
/// upload must be refused, which this checks and says.
fn uploaded_or_refused<T, E: std::fmt::Display>(p: Precision, upload: Result<T, E>) -> Option<T> {
    let dev = device();
    match (upload, dev.precision_refusal(p)) {
        (Ok(t), None) => Some(t),
        (Ok(_), Some(why)) => panic!("tier {}: a {p} upload must be refused ({why})", dev.tier()),
        (Err(e), Some(_)) => {
            println!("tier {}: {p} refused as it must be ({e})", dev.tier());
            None
        }
        (Err(e), None) => panic!("{p} upload: {e}"),
    }
}

fn bitwise(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

fn checkpoint(model: &str) -> vision_towers::st_reader::Checkpoint {
    vision_towers::st_reader::Checkpoint::open(fixtures().join("models").join(model))
        .expect("fixture checkpoint")
}

/// The fixture images, prepared by `model`'s own processor on the host.
fn prepared(model: &str, images: &[&str]) -> Vec<Prepared> {
    let m = Model::open(
        &fixtures().join("models").join(model),
        Device::Cpu,
        PrepSettings::default(),
    )
    .expect("fixture model");
    images
        .iter()
        .map(|i| {
            let bytes = std::fs::read(fixtures().join("images").join(i)).expect("fixture image");
            m.preprocessor()
                .prepare(ImageSource::Bytes(&bytes))
                .expect("prepared")
        })
        .collect()
}

/// What the graph test needs from one CUDA tower, over three batches: `A`, `A2` (A's layout,
/// other values) and `B` (another layout, no larger than A's workspace needs to grow past).
trait GraphTower {
    type Batch;
    fn batch(&mut self, which: Which, staged: bool) -> Self::Batch;
    fn run(&mut self, b: &Self::Batch) -> Ran;
    fn rows(&mut self, b: &Self::Batch) -> Vec<f32>;
    fn set_graphs(&mut self, on: bool);
    fn stats(&self) -> GraphStats;
    fn status(&self) -> GraphStatus;
}

/// The [`GraphTower`] of one CUDA tower wrapper (a `cuda` field and an `images(Which)` method);
/// `$rows` flattens what its `rows` returns into one vector.
macro_rules! graph_tower {
    ($tower:ident, $cuda:ident, $batch:ty, $rows:expr) => {
        impl GraphTower for $tower {
            type Batch = $batch;
            fn batch(&mut self, w: Which, staged: bool) -> Self::Batch {
                let images = self.images(w);
                let host = $cuda::prepare_host(self.cuda.config(), self.cuda.precision(), &images)
                    .expect("host batch");
                let b = if staged {
                    self.cuda.stage(host, gpu_core::HostCopy::OneThread)
                } else {
                    self.cuda.prepare(&images)
                };
                b.expect("batch")
            }
            fn run(&mut self, b: &Self::Batch) -> Ran {
                self.cuda.run_graphed(b, false).expect("run").1
            }
            fn rows(&mut self, b: &Self::Batch) -> Vec<f32> {
                $rows(self.cuda.rows(b).expect("rows"))
            }
            fn set_graphs(&mut self, on: bool) {
                self.cuda.set_graphs(on)
            }
            fn stats(&self) -> GraphStats {
                self.cuda.graph_stats()
            }
            fn status(&self) -> GraphStatus {
                self.cuda.graph_status().clone()
            }
        }
    };
}

#[derive(Debug, Clone, Copy)]
enum Which {
    A,
    A2,
    B,
}

/// The common body: eager rows first (graphs off), then the graph sequence, all bitwise.
fn check_graphs<T: GraphTower>(name: &str, t: &mut T) {
    t.set_graphs(false);
    let eager = |t: &mut T, w: Which| {
        let b = t.batch(w, false);
        assert_eq!(t.run(&b), Ran::Eager, "{name}: graphs off runs eagerly");
        t.rows(&b)
    };
    let (ea, ea2, eb) = (eager(t, Which::A), eager(t, Which::A2), eager(t, Which::B));
    assert!(
        bitwise(&ea, &eager(t, Which::A)),
        "{name}: two eager runs differ (the kernels are not deterministic)"
    );
    assert!(!bitwise(&ea, &ea2), "{name}: A2 must differ from A");
    t.set_graphs(true);
    let s0 = t.stats();
    let step = |t: &mut T, w: Which, staged: bool, want: &[f32], ran: Ran| {
        let b = t.batch(w, staged);
        assert_eq!(t.run(&b), ran, "{name}: {w:?} (staged {staged})");
        let got = t.rows(&b);
        assert!(
            bitwise(&got, want),
            "{name}: {w:?} {ran:?} (staged {staged}) rows differ from the eager rows"
        );
    };
    step(t, Which::A, false, &ea, Ran::Eager);
    step(t, Which::A, false, &ea, Ran::Captured);
    step(t, Which::A, false, &ea, Ran::Replayed);
    step(t, Which::A2, false, &ea2, Ran::Replayed);
    step(t, Which::B, false, &eb, Ran::Eager);
    step(t, Which::B, false, &eb, Ran::Captured);
    step(t, Which::B, true, &eb, Ran::Replayed);
    step(t, Which::A, true, &ea, Ran::Replayed);
    step(t, Which::A2, true, &ea2, Ran::Replayed);
    let s = t.stats();
    assert_eq!(
        s.captures - s0.captures,
        2,
        "{name}: one capture per layout"
    );
    assert_eq!(s.replays - s0.replays, 5, "{name}: replays");
    assert_eq!(s.invalidations, s0.invalidations, "{name}: no reallocation");
    assert_eq!(t.status(), GraphStatus::Enabled, "{name}");
    println!("GRAPHS {name}: eager = capture = replay bitwise on 2 layouts and new values; {s:?}");
}

struct Gemma {
    cuda: GemmaCuda,
    prepared: Vec<Prepared>,
    flipped: Vec<Vec<f32>>,
}

impl Gemma {
    fn images(&self, w: Which) -> Vec<GemmaImage<'_>> {
        let g = |i: usize, flip: bool| {
            let p = self.prepared[i].gemma4().expect("gemma4 inputs");
            GemmaImage {
                patches: if flip { &self.flipped[i] } else { p.patches },
                positions: p.positions,
            }
        };
        match w {
            Which::A => vec![g(0, false), g(1, false)],
            Which::A2 => vec![g(0, true), g(1, true)],
            Which::B => vec![g(1, false)],
        }
    }
}

graph_tower!(
    Gemma,
    GemmaCuda,
    vision_towers::tower_gemma::GemmaBatch,
    |r: Vec<Vec<f32>>| r.concat()
);

#[test]
#[ignore = "needs a CUDA device"]
fn gemma_graph_replays_equal_eager_rows_bitwise() {
    let ck = checkpoint("gemma4");
    let tower = GemmaTower::from_checkpoint(&ck).expect("fixture tower");
    for precision in GRAPH_PRECISIONS {
        let Some(cuda) = uploaded_or_refused(precision, tower.to_cuda(device(), precision)) else {
            continue;
        };
        let prepared = prepared("gemma4", &["coffee_144x96.jpg", "logo_rgba_112x84.png"]);
        let flipped = prepared
            .iter()
            .map(|p| {
                let g = p.gemma4().expect("gemma4 inputs");
                g.patches.iter().map(|v| 1.0 - v).collect()
            })
            .collect();
        check_graphs(
            &format!("gemma4 {precision}"),
            &mut Gemma {
                cuda,
                prepared,
                flipped,
            },
        );
    }
}

struct Glm {
    cuda: GlmCuda,
    prepared: Vec<Prepared>,
    flipped: Vec<Vec<f32>>,
}

impl Glm {
    fn images(&self, w: Which) -> Vec<GlmImage<'_>> {
        let g = |i: usize, flip: bool| {
            let p = self.prepared[i].glm().expect("glm inputs");
            GlmImage {
                patches: if flip { &self.flipped[i] } else { p.patches },
                grid_thw: p.grid_thw,
            }
        };
        match w {
            Which::A => vec![g(0, false), g(1, false)],
            Which::A2 => vec![g(0, true), g(1, true)],
            Which::B => vec![g(1, false)],
        }
    }
}

graph_tower!(
    Glm,
    GlmCuda,
    vision_towers::tower_glm5::GlmBatch,
    |r: Vec<Vec<f32>>| r.concat()
);

#[test]
#[ignore = "needs a CUDA device"]
fn glm_graph_replays_equal_eager_rows_bitwise() {
    for (model, precision) in ["glm5_next", "glm_ocr"]
        .into_iter()
        .flat_map(|m| GRAPH_PRECISIONS.map(|p| (m, p)))
    {
        let ck = checkpoint(model);
        let tower = GlmTower::from_checkpoint(&ck).expect("fixture tower");
        let Some(cuda) = uploaded_or_refused(precision, tower.to_cuda(device(), precision)) else {
            continue;
        };
        let prepared = prepared(model, &["coffee_144x96.jpg", "tiny_20x15.png"]);
        let flipped = prepared
            .iter()
            .map(|p| {
                p.glm()
                    .expect("glm inputs")
                    .patches
                    .iter()
                    .map(|v| -v)
                    .collect()
            })
            .collect();
        check_graphs(
            &format!("{model} {precision}"),
            &mut Glm {
                cuda,
                prepared,
                flipped,
            },
        );
    }
}

/// Deterministic pseudo-random pixels in [-2, 2].
fn pixels(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            ((s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        })
        .collect()
}

struct Step {
    cuda: StepCuda,
    /// Seeds 0..: 3 crops of 112², a 168² global and a 140×126 global, then the same again.
    views: Vec<Vec<f32>>,
}

impl Step {
    fn images(&self, w: Which) -> Vec<StepImage<'_>> {
        let v = |i: usize, h: usize, wd: usize| StepView {
            pixels: &self.views[i],
            height: h,
            width: wd,
        };
        let o = match w {
            Which::A | Which::B => 0,
            Which::A2 => 5,
        };
        let crops = StepImage {
            crops: (0..3).map(|i| v(o + i, 112, 112)).collect(),
            global: v(o + 3, 168, 168),
            newline_mask: vec![false, false, true],
        };
        let plain = StepImage {
            crops: vec![],
            global: v(o + 4, 140, 126),
            newline_mask: vec![],
        };
        match w {
            Which::A | Which::A2 => vec![crops, plain],
            Which::B => vec![plain],
        }
    }
}

graph_tower!(
    Step,
    StepCuda,
    vision_towers::tower_step::StepBatch,
    |r: Vec<vision_towers::tower_step::StepRows>| r.into_iter().flat_map(|r| r.rows).collect()
);

#[test]
#[ignore = "needs a CUDA device"]
fn step_graph_replays_equal_eager_rows_bitwise() {
    for (model, precision) in ["step3p7", "step3p7_hf"]
        .into_iter()
        .flat_map(|m| GRAPH_PRECISIONS.map(|p| (m, p)))
    {
        let ck = checkpoint(model);
        let tower = StepTower::from_checkpoint(&ck).expect("fixture tower");
        let Some(cuda) = uploaded_or_refused(precision, tower.to_cuda(device(), precision)) else {
            continue;
        };
        let sizes = [112 * 112, 112 * 112, 112 * 112, 168 * 168, 140 * 126];
        let views = (0..10)
            .map(|i| pixels(3 * sizes[i % 5], 40 + i as u64))
            .collect();
        check_graphs(&format!("{model} {precision}"), &mut Step { cuda, views });
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn f32_mode_never_captures() {
    let ck = checkpoint("step3p7");
    let tower = StepTower::from_checkpoint(&ck).expect("fixture tower");
    let cuda = tower.to_cuda(device(), Precision::F32).expect("upload");
    let sizes = [112 * 112, 112 * 112, 112 * 112, 168 * 168, 140 * 126];
    let views = (0..10)
        .map(|i| pixels(3 * sizes[i % 5], 40 + i as u64))
        .collect();
    let mut t = Step { cuda, views };
    for _ in 0..3 {
        let b = t.batch(Which::A, false);
        assert_eq!(t.run(&b), Ran::Eager);
    }
    assert_eq!(t.stats().captures, 0);
}

const STREAM_IMAGES: [&str; 5] = [
    "coffee_144x96.jpg",
    "tiny_20x15.png",
    "logo_rgba_112x84.png",
    "chelsea_168x112.webp",
    "camera_gray_96x96.png",
];

/// The stream policies tried: passes of five images (each pass the same three layouts, so later
/// passes replay graphs), and of two (passes of every size in turn, so a pass's rows go into a
/// rows buffer a larger pass left: `gpu_core::PassQueue` reuses the two it keeps).
const STREAM_POLICIES: [usize; 2] = [5, 2];

#[test]
#[ignore = "needs a CUDA device"]
fn a_cuda_stream_gives_the_rows_encode_gives_for_the_same_passes() {
    let bytes: Vec<Vec<u8>> = STREAM_IMAGES
        .iter()
        .map(|i| std::fs::read(fixtures().join("images").join(i)).expect("fixture image"))
        .collect();
    // Three rounds of the five images: layouts repeat, so later passes replay graphs.
    let stream: Vec<Vec<u8>> = (0..3).flat_map(|_| bytes.iter().cloned()).collect();
    let dev = device();
    for precision in [Precision::Bf16, Precision::F16, Precision::F32] {
        if let Some(why) = dev.precision_refusal(precision) {
            println!("tier {}: no {precision} stream ({why})", dev.tier());
            continue;
        }
        for model in ["gemma4", "glm5_next", "glm_ocr", "step3p7"] {
            let options = TowerOptions {
                device: Device::Cuda(0),
                precision: Some(precision),
                graphs: true,
                ..TowerOptions::default()
            };
            let m = Model::open_with(
                &fixtures().join("models").join(model),
                &options,
                PrepSettings::default(),
            )
            .expect("fixture model on CUDA");
            let sources: Vec<ImageSource<'_>> =
                stream.iter().map(|b| ImageSource::Bytes(b)).collect();
            for max_images in STREAM_POLICIES {
                let policy = BatchPolicy {
                    max_images,
                    max_patches: usize::MAX,
                };
                let case = format!("{model} {precision}, passes of {max_images}");
                // encode's rows for the same passes (the policy cuts the stream so, every image
                // fits and the patches are unbounded)
                let mut want: Vec<Encoded> = Vec::new();
                for pass in sources.chunks(max_images) {
                    want.extend(m.encode(pass).expect("encode"));
                }
                let mut got: Vec<(usize, Encoded)> = Vec::new();
                let stats = m
                    .encode_stream(stream.iter(), policy, |i, r| {
                        got.push((i, r.unwrap_or_else(|e| panic!("{case}: image {i}: {e}"))))
                    })
                    .expect("stream");
                assert_eq!(
                    got.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
                    (0..stream.len()).collect::<Vec<_>>(),
                    "{case}: input order"
                );
                assert_eq!(
                    stats.passes.len(),
                    stream.len().div_ceil(max_images),
                    "{case}: passes"
                );
                for ((i, e), w) in got.iter().zip(&want) {
                    assert_eq!(e.plan, w.plan, "{case}: image {i}");
                    assert!(
                        bitwise(&e.rows, &w.rows),
                        "{case}: image {i}: stream rows differ from encode's for the same pass"
                    );
                }
                if precision != Precision::F32 {
                    assert_eq!(
                        m.tower().graph_status(),
                        Some(GraphStatus::Enabled),
                        "{case}"
                    );
                }
                println!(
                    "STREAM-CUDA {case}: {} images in {} passes bitwise equal to encode; graphs \
                     {:?}; waited for input {:.3} s, for the device {:.3} s",
                    stats.encoded,
                    stats.passes.len(),
                    m.tower().graph_stats(),
                    stats.waited_for_input_s,
                    stats.waited_for_device_s
                );
            }
        }
    }
}
