//! A tower and a model are `Send + Sync`, and encodes from several threads at once give results
//! identical, bit for bit, to serial ones on the host path (the CUDA path: `tests/cuda.rs`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use vision_towers::vision_prep::{ImageSource, PrepSettings};
use vision_towers::{preprocessor_for, Device, Tower, WeightFile};

/// The fixtures: `VT_FIXTURES` (a test binary run on another machine), else this checkout's.
fn fixtures() -> PathBuf {
    std::env::var_os("VT_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures"))
}

const fn assert_send_sync<T: Send + Sync>() {}
const _: () = assert_send_sync::<Tower>();
const _: () = assert_send_sync::<vision_towers::Model>();

#[test]
fn concurrent_host_encodes_equal_serial_ones_bitwise() {
    let images = [
        "tiny_20x15.png",
        "coffee_144x96.jpg",
        "logo_rgba_112x84.png",
        "chelsea_168x112.webp",
    ];
    for model in ["models/gemma4", "models/glm5_next", "models/step3p7"] {
        let path = fixtures().join(model);
        let tower = Arc::new(Tower::open(&path, Device::Cpu).unwrap());
        let file = WeightFile::open(&path).unwrap();
        let pre = Arc::new(preprocessor_for(&path, &file, PrepSettings::default()).unwrap());
        let bytes: Vec<Vec<u8>> = images
            .iter()
            .map(|i| std::fs::read(fixtures().join("images").join(i)).unwrap())
            .collect();
        let encode = |tower: &Tower, pre: &vision_towers::vision_prep::Preprocessor, b: &[u8]| {
            let prepared = pre.prepare(ImageSource::Bytes(b)).unwrap();
            tower.encode_prepared(&prepared).unwrap().per_image.concat()
        };
        let serial: Vec<Vec<f32>> = bytes.iter().map(|b| encode(&tower, &pre, b)).collect();
        let bytes = Arc::new(bytes);
        let handles: Vec<_> = (0..8)
            .map(|t| {
                let (tower, pre, bytes) =
                    (Arc::clone(&tower), Arc::clone(&pre), Arc::clone(&bytes));
                std::thread::spawn(move || {
                    let i = t % bytes.len();
                    (i, encode(&tower, &pre, &bytes[i]))
                })
            })
            .collect();
        for h in handles {
            let (i, rows) = h.join().unwrap();
            let same = rows.len() == serial[i].len()
                && rows
                    .iter()
                    .zip(&serial[i])
                    .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{model}: thread result for {} differs from the serial one",
                images[i]
            );
        }
    }
}

/// `Model::encode` of several images in one pass gives each image the rows it gets alone, and
/// lands on each image's plan.
#[test]
fn batched_model_encode_equals_one_at_a_time() {
    use vision_towers::{LmAttention, Model};
    let images = [
        "tiny_20x15.png",
        "coffee_144x96.jpg",
        "chelsea_168x112.webp",
    ];
    let bytes: Vec<Vec<u8>> = images
        .iter()
        .map(|i| std::fs::read(fixtures().join("images").join(i)).unwrap())
        .collect();
    for model in ["models/gemma4", "models/glm_ocr", "models/step3p7_sharded"] {
        let m = Model::open(
            &fixtures().join(model),
            Device::Cpu,
            PrepSettings::default(),
        )
        .unwrap();
        assert_eq!(m.lm_attention(), LmAttention::Causal, "{model}");
        let sources: Vec<ImageSource<'_>> = bytes.iter().map(|b| ImageSource::Bytes(b)).collect();
        let batch = m.encode(&sources).unwrap();
        assert_eq!(batch.len(), images.len());
        for (i, src) in sources.iter().enumerate() {
            let alone = m.encode(std::slice::from_ref(src)).unwrap().remove(0);
            assert_eq!(
                batch[i].plan,
                m.plan(*src).unwrap(),
                "{model} {}",
                images[i]
            );
            assert_eq!(
                batch[i].rows.len(),
                batch[i].plan.rows as usize * batch[i].width
            );
            let rel = batch[i]
                .rows
                .iter()
                .zip(&alone.rows)
                .map(|(a, b)| (a - b).powi(2) as f64)
                .sum::<f64>()
                .sqrt()
                / alone
                    .rows
                    .iter()
                    .map(|b| (*b as f64).powi(2))
                    .sum::<f64>()
                    .sqrt();
            assert!(
                rel <= 1e-6,
                "{model} {}: batched vs alone rel-L2 {rel:e}",
                images[i]
            );
        }
    }
}
