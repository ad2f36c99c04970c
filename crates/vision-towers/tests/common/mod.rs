//! What the facade's device tests share: the fixtures, the fixture models with a CUDA path, the
//! test images, opening a model, the ceiling's own measure of an image, and filling the card.
#![allow(dead_code)] // each test target uses its own part

use std::path::{Path, PathBuf};

use vision_towers::gpu_core::{self, DeviceBuffer, GpuError};
use vision_towers::vision_prep::{ImageSource, PrepSettings};
use vision_towers::{Device, Model, ModelError, Precision, TowerError, TowerOptions};

/// Every fixture model (each family has a CUDA path).
pub const CUDA_MODELS: [&str; 10] = [
    "models/gemma4",
    "models/gemma4_clipped",
    "models/gemma4_gguf/mmproj-BF16.gguf",
    "models/gemma4_gguf/mmproj-F16.gguf",
    "models/gemma4_gguf/mmproj-clipped-BF16.gguf",
    "models/glm5_next",
    "models/glm_ocr",
    "models/step3p7",
    "models/step3p7_hf",
    "models/step3p7_sharded",
];

/// The request every device test encodes.
pub const IMAGES: [&str; 4] = [
    "coffee_144x96.jpg",
    "tiny_20x15.png",
    "logo_rgba_112x84.png",
    "chelsea_168x112.webp",
];

/// The fixtures: `VT_FIXTURES` (a test binary run on another machine), else this checkout's.
pub fn fixtures() -> PathBuf {
    std::env::var_os("VT_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures"))
}

/// The bytes of [`IMAGES`].
pub fn image_bytes() -> Vec<Vec<u8>> {
    IMAGES
        .iter()
        .map(|i| std::fs::read(fixtures().join("images").join(i)).unwrap())
        .collect()
}

/// Opens a fixture model on `device` with `precision`, a pass ceiling and graphs on or off.
pub fn open(
    model: &str,
    device: Device,
    precision: Option<Precision>,
    ceiling: usize,
    graphs: bool,
) -> Model {
    let options = TowerOptions {
        device,
        precision,
        max_patches_per_pass: ceiling,
        graphs,
        force_tier: None,
    };
    Model::open_with(&fixtures().join(model), &options, PrepSettings::default())
        .unwrap_or_else(|e| panic!("{model} on {device}: {e}"))
}

/// The largest image's patches, from the ceiling's own refusal at one patch per pass (host).
pub fn largest_image(model: &str, sources: &[ImageSource<'_>]) -> usize {
    let tiny = open(model, Device::Cpu, None, 1, false);
    sources
        .iter()
        .map(|s| match tiny.encode(std::slice::from_ref(s)) {
            Err(ModelError::Tower(TowerError::OverPassCeiling { patches, .. })) => patches,
            other => panic!("{model}: expected the ceiling's refusal, got {other:?}"),
        })
        .max()
        .unwrap_or(1)
}

/// Allocates device memory until the card is full: chunks from 4 GiB down to 64 KiB, each size
/// until it fails with out-of-memory. Returns the buffers and the bytes they hold.
pub fn fill_the_card(dev: &gpu_core::Device) -> (Vec<DeviceBuffer<f32>>, usize) {
    let mut ballast = Vec::new();
    let mut held = 0usize;
    let mut chunk = 4usize << 30;
    while chunk >= 64 << 10 {
        loop {
            match dev.alloc::<f32>(chunk / 4) {
                Ok(b) => {
                    ballast.push(b);
                    held += chunk;
                }
                Err(GpuError::OutOfMemory { .. }) => break,
                Err(e) => panic!("ballast allocation of {chunk} bytes: {e}"),
            }
        }
        chunk /= 4;
    }
    (ballast, held)
}
