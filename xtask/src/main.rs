//! `cargo xtask <command>`: the project's automation, in the rust-analyzer manner.

mod api_bench;
mod bench;
mod bench_towers;
mod clocks;
mod dist;
mod fixtures;
mod fuzz;
mod gemma_check;
mod glm_check;
mod gpu;
mod kernel_bench;
mod package;
mod parity;
mod parity_case;
mod parity_device;
mod pipeline;
mod prep_breakdown;
mod progress;
mod rows_digest;
mod step_check;
mod suite;
mod towers;
mod towers_glm;
mod towers_step;
mod wheel;

use anyhow::{bail, Result};
use std::path::PathBuf;

const USAGE: &str = "usage: cargo xtask <command> [args]

commands:
  test       the whole suite CI runs: cargo test --workspace --locked, parity, the Python
             package's tests against the manylinux wheel installed in a fresh venv (--no-python
             skips them, --python-only runs only them), package (--no-package skips it), dist
             --check (--no-dist skips it), then
             every fuzz target for 60 s on top of the committed corpus (cargo xtask fuzz;
             --no-fuzz skips it)
  dist       the C library as target/dist/vision-towers-<version>-x86_64-linux.tar.gz (lib/,
             include/, pkg-config, CMake config) [--check: unpack it elsewhere, build the C
             example with pkg-config and the C++ one with CMake against it, compare their rows
             with upstream's]
  wheel      the manylinux wheel the Python step tests, alone (target/wheels-ship/; its path last)
  package    every library crate as the .crate cargo publish would upload (target/package/):
             sizes and file counts, fails over crates.io's 10 MiB or when gpu-core's lacks a
             kernel file it needs, then builds the crates from those .crate files alone
             [--allow-dirty: package uncommitted changes too]
  fuzz       the cargo-fuzz targets of fuzz/, each for a bounded time on the committed corpus;
             new inputs to target/fuzz/new, a crash fails it with the reproducer's path
             [--seconds N] [--target T] [--jobs J] [--merge [--seeds]] [--reproduce FILE]
  fixtures   regenerate the oracle fixtures from upstream (makes its own Python venv)
  parity     compare every available path against the oracle fixtures and print the table
             [--require-cuda: a CUDA row that did not run fails; implied where a GPU is present]
  rows-digest  one sha256 of the host (CPU) rows per fixture model and image, through the facade
             (alone and batched): diff the output before and after a refactor
  ptx        compile crates/gpu-core/kernels/*.cu to committed PTX (nvcc) and that PTX to committed
             SASS fatbins (CUDA machine only)
  gpu-test   every GPU (ignored) test of the workspace, then parity --require-cuda; needs a
             CUDA device and fails when no GPU test ran [--prepare: stage binaries in .device/]
  bench      our towers against PyTorch (eager, torch.compile) on the anchors' shapes (GPU machine)
  pipeline   encode_stream on step3p7: end-to-end images/s vs the tower alone, graphs on/off (GPU machine)
  api-bench  Model::encode_device end to end per call (bytes to rows ready on the device; GPU machine)
  prep-breakdown  one image's host stages timed alone (admission, decode, resize, norm+patch,
             to tower) per family on generated 1920x1080 / 1304x896 JPEGs; no GPU needed
             [--iters N] [--family F] [--save DIR: write the JPEGs and release processor configs]
  kernel-bench  gpu-core's kernels timed alone: attention, GEMM, memory-bound ops, the floors
             (GPU machine; BENCH_ONLY=attn,gemm,mem,floor narrows it)
  gemma-check <repo> <case>  a full-size Gemma-4 checkpoint on CUDA: rel-L2 against the upstream
             rows of xtask/bench/gemma_fullsize.py, timings, per-op cost of one layer (GPU machine)
  glm-check [iters]  glm5_next at full size on random weights: timings and TFLOP/s (GPU machine)
  step-check <repo> <case> [--host] [--iters N]  a full-size Step-3.7 checkpoint: rel-L2 against
             the upstream rows of xtask/bench/step_fullsize.py, timings (GPU machine)

environment:
  XTASK_SIMULATE_GPU=1   act as if a GPU were present (parity requires CUDA; the device open
                         reads the PTX first, so GPU_CORE_PTX_DIR=/nonexistent fails it)
";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first() else {
        eprint!("{USAGE}");
        bail!("no command given");
    };
    let rest = &args[1..];
    match cmd.as_str() {
        "test" => suite::run(rest),
        "dist" => dist::run(rest),
        "fixtures" => fixtures::run(rest),
        "fuzz" => fuzz::run(rest),
        "package" => package::run(rest),
        "wheel" => wheel::run(rest),
        "parity" => parity::run(rest),
        "rows-digest" => rows_digest::run(rest),
        "ptx" => gpu::ptx(rest),
        "gpu-test" => gpu::gpu_test(rest),
        "bench" => bench::run(rest),
        "pipeline" => pipeline::run(rest),
        "api-bench" => api_bench::run(rest),
        "prep-breakdown" => prep_breakdown::run(rest),
        "kernel-bench" => kernel_bench::run(rest),
        "gemma-check" => gemma_check::run(rest),
        "glm-check" => glm_check::run(rest),
        "step-check" => step_check::run(rest),
        "-h" | "--help" | "help" => {
            print!("{USAGE}");
            Ok(())
        }
        other => {
            eprint!("{USAGE}");
            bail!("unknown command `{other}`")
        }
    }
}

/// The workspace root (the parent of `xtask/`).
pub(crate) fn workspace_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().map(PathBuf::from).unwrap_or(here)
}
