//! The ceiling on patches per pass: a request split into several passes gives, bit for bit, the
//! rows of one pass on the host path, per image and in order; one image over the ceiling is a
//! typed refusal naming it.

use std::path::{Path, PathBuf};
use vision_towers::vision_prep::{ImageSource, PrepSettings};
use vision_towers::{Device, Model, ModelError, TowerError, TowerOptions};

/// The fixtures: `VT_FIXTURES` (a test binary run on another machine), else this checkout's.
fn fixtures() -> PathBuf {
    std::env::var_os("VT_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures"))
}

fn open(model: &str, max_patches_per_pass: usize) -> Result<Model, ModelError> {
    let options = TowerOptions {
        device: Device::Cpu,
        precision: None,
        max_patches_per_pass,
        graphs: false,
        force_tier: None,
    };
    Model::open_with(&fixtures().join(model), &options, PrepSettings::default())
}

/// Three fixture images of different sizes and formats: their names and bytes.
fn three_images() -> ([&'static str; 3], Vec<Vec<u8>>) {
    let images = [
        "coffee_144x96.jpg",
        "camera_gray_96x96.png",
        "logo_rgba_112x84.png",
    ];
    let bytes = images
        .iter()
        .map(|i| std::fs::read(fixtures().join("images").join(i)).unwrap())
        .collect();
    (images, bytes)
}

/// Each image's patches, from the ceiling's own refusal at a ceiling of one patch.
fn patches_of(model: &str, sources: &[ImageSource<'_>]) -> Vec<usize> {
    let tiny = open(model, 1).unwrap();
    sources
        .iter()
        .map(|s| match tiny.encode(std::slice::from_ref(s)) {
            Err(ModelError::Tower(TowerError::OverPassCeiling {
                index: 0,
                patches,
                ceiling: 1,
                ..
            })) => patches,
            other => panic!("{model}: expected the ceiling's refusal, got {other:?}"),
        })
        .collect()
}

#[test]
fn a_batch_split_by_a_small_ceiling_gives_the_rows_of_one_pass_bitwise() {
    let (images, bytes) = three_images();
    let sources: Vec<ImageSource<'_>> = bytes.iter().map(|b| ImageSource::Bytes(b)).collect();
    for model in ["models/gemma4", "models/glm5_next", "models/step3p7"] {
        let patches = patches_of(model, &sources);
        let largest = *patches.iter().max().unwrap();
        let total: usize = patches.iter().sum();
        assert!(
            total > largest,
            "{model}: patches {patches:?} would not split"
        );
        let one_pass = open(model, total).unwrap().encode(&sources).unwrap();
        for ceiling in [largest, total - 1] {
            let split = open(model, ceiling).unwrap().encode(&sources).unwrap();
            assert_eq!(split.len(), images.len(), "{model} at {ceiling}");
            for (i, (a, b)) in one_pass.iter().zip(&split).enumerate() {
                assert_eq!(a.plan, b.plan, "{model} at {ceiling}: {}", images[i]);
                assert_eq!(a.width, b.width);
                let same = a.rows.len() == b.rows.len()
                    && a.rows
                        .iter()
                        .zip(&b.rows)
                        .all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(
                    same,
                    "{model}: {} differs when the request is split at {ceiling} patches per pass \
                     (patches {patches:?})",
                    images[i]
                );
            }
        }
    }
}

#[test]
fn an_image_over_the_ceiling_is_refused_by_index_before_any_pass() {
    let names = ["coffee_144x96.jpg", "tiny_20x15.png"];
    let bytes: Vec<Vec<u8>> = names
        .iter()
        .map(|i| std::fs::read(fixtures().join("images").join(i)).unwrap())
        .collect();
    let sources: Vec<ImageSource<'_>> = bytes.iter().map(|b| ImageSource::Bytes(b)).collect();
    let patches = patches_of("models/gemma4", &sources);
    assert!(patches[1] > patches[0], "{patches:?}");
    let model = open("models/gemma4", patches[1] - 1).unwrap();
    let err = model.encode(&sources).unwrap_err();
    match &err {
        ModelError::Tower(TowerError::OverPassCeiling {
            index, patches: p, ..
        }) => {
            assert_eq!((*index, *p), (1, patches[1]));
        }
        other => panic!("expected OverPassCeiling, got {other:?}"),
    }
    assert!(err.to_string().contains("max_patches_per_pass"), "{err}");
    assert!(!err.is_out_of_memory());
    // The model is untouched: the image under the ceiling still encodes.
    assert_eq!(model.encode(&sources[..1]).unwrap().len(), 1);
}

#[test]
fn a_ceiling_of_zero_is_refused_at_open() {
    match open("models/gemma4", 0) {
        Err(ModelError::Tower(TowerError::Unsupported(m))) => {
            assert!(m.contains("max_patches_per_pass"), "{m}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// `Model::encode` hands its prepared pixels back to the preprocessor: the next call writes into
/// those buffers. Repeated calls in reverse and shuffled order must give every image's rows bit
/// for bit as a fresh model does.
#[test]
fn calls_after_recycled_outputs_give_the_first_rows_bitwise() {
    let (images, bytes) = three_images();
    for model in ["models/gemma4", "models/glm5_next", "models/step3p7"] {
        let fresh: Vec<Vec<f32>> = bytes
            .iter()
            .map(|b| {
                let m = open(model, 1 << 20).unwrap();
                m.encode(&[ImageSource::Bytes(b)]).unwrap().remove(0).rows
            })
            .collect();
        let m = open(model, 1 << 20).unwrap();
        for order in [[0usize, 1, 2], [2, 1, 0], [1, 2, 0]] {
            let sources: Vec<ImageSource<'_>> = order
                .iter()
                .map(|&i| ImageSource::Bytes(&bytes[i]))
                .collect();
            let got = m.encode(&sources).unwrap();
            for (k, &i) in order.iter().enumerate() {
                let same = got[k].rows.len() == fresh[i].len()
                    && got[k]
                        .rows
                        .iter()
                        .zip(&fresh[i])
                        .all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(
                    same,
                    "{model}: {} differs after recycled calls ({order:?})",
                    images[i]
                );
            }
        }
    }
}
