//! `Model::encode_stream` on the host path: every image's rows in input order, bit for bit those
//! of `encode`; passes that follow the batch policy; a bad image an error at its index while the
//! others go on; an image over the patch ceiling refused by index; a bounded number of images
//! pulled ahead of the results.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use vision_towers::vision_prep::{ImageSource, PrepSettings};
use vision_towers::{
    BatchPolicy, Device, Encoded, Model, ModelError, StreamStats, TowerError, TowerOptions,
};

fn fixtures() -> PathBuf {
    std::env::var_os("VT_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures"))
}

fn open(model: &str) -> Model {
    let options = TowerOptions {
        device: Device::Cpu,
        ..TowerOptions::default()
    };
    Model::open_with(
        &fixtures().join("models").join(model),
        &options,
        PrepSettings::default(),
    )
    .expect("fixture model")
}

fn image(name: &str) -> Vec<u8> {
    std::fs::read(fixtures().join("images").join(name)).expect("fixture image")
}

const IMAGES: [&str; 5] = [
    "coffee_144x96.jpg",
    "camera_gray_96x96.png",
    "logo_rgba_112x84.png",
    "chelsea_168x112.webp",
    "tiny_20x15.png",
];

fn bitwise(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// What the sink saw, in its order.
type Seen = Vec<(usize, Result<Encoded, ModelError>)>;

/// Runs a stream and returns (index, result) in the order the sink saw them.
fn collect<B: AsRef<[u8]> + Send>(
    m: &Model,
    images: Vec<B>,
    policy: BatchPolicy,
) -> (Seen, StreamStats) {
    let mut out = Vec::new();
    let stats = m
        .encode_stream(images, policy, |i, r| out.push((i, r)))
        .expect("the stream runs to its end");
    (out, stats)
}

#[test]
fn a_stream_gives_every_image_its_encode_rows_in_order() {
    let bytes: Vec<Vec<u8>> = IMAGES.iter().map(|i| image(i)).collect();
    let sources: Vec<ImageSource<'_>> = bytes.iter().map(|b| ImageSource::Bytes(b)).collect();
    for model in ["gemma4", "glm5_next", "glm_ocr", "step3p7"] {
        let m = open(model);
        let want = m.encode(&sources).expect("encode");
        // Twice the images, two per pass: passes straddle the repetition.
        let stream: Vec<&[u8]> = bytes.iter().chain(&bytes).map(|b| b.as_slice()).collect();
        let policy = BatchPolicy {
            max_images: 2,
            max_patches: usize::MAX,
        };
        let (got, stats) = collect(&m, stream, policy);
        assert_eq!(
            got.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            (0..10).collect::<Vec<_>>(),
            "{model}: one result per image, in input order"
        );
        for (i, r) in got {
            let e = r.unwrap_or_else(|e| panic!("{model} image {i}: {e}"));
            let w = &want[i % IMAGES.len()];
            assert_eq!(e.plan, w.plan, "{model} image {i}");
            assert!(bitwise(&e.rows, &w.rows), "{model} image {i}: rows differ");
        }
        assert_eq!((stats.encoded, stats.failed), (10, 0), "{model}");
        assert_eq!(stats.passes.len(), 5, "{model}: {:?}", stats.passes);
        let mut next = 0;
        for p in &stats.passes {
            assert_eq!(p.first, next, "{model}: passes are consecutive");
            assert!((1..=2).contains(&p.images), "{model}: {p:?}");
            next += p.images;
        }
    }
}

#[test]
fn passes_respect_the_patch_ceiling_and_hold_whole_images() {
    let m = open("gemma4");
    let bytes: Vec<Vec<u8>> = IMAGES.iter().map(|i| image(i)).collect();
    let (_, one) = collect(
        &m,
        bytes.clone(),
        BatchPolicy {
            max_images: 1,
            max_patches: usize::MAX,
        },
    );
    let patches: Vec<usize> = one.passes.iter().map(|p| p.patches).collect();
    let largest = *patches.iter().max().expect("passes");
    let ceiling = largest + 1;
    let (got, stats) = collect(
        &m,
        bytes,
        BatchPolicy {
            max_images: 100,
            max_patches: ceiling,
        },
    );
    assert!(got.iter().all(|(_, r)| r.is_ok()));
    assert!(stats.passes.len() > 1, "{:?}", stats.passes);
    for p in &stats.passes {
        assert!(p.patches <= ceiling, "{p:?} over {ceiling}");
        let sum: usize = patches[p.first..p.first + p.images].iter().sum();
        assert_eq!(p.patches, sum, "whole images per pass");
    }
    // Greedy: a pass ends only where the next image would not fit.
    for w in stats.passes.windows(2) {
        assert!(w[0].patches + patches[w[1].first] > ceiling, "{:?}", w);
    }
}

#[test]
fn a_bad_image_is_an_error_at_its_index_and_the_others_go_on() {
    let m = open("step3p7");
    let good = image("coffee_144x96.jpg");
    let stream: Vec<Vec<u8>> = vec![
        good.clone(),
        b"not an image at all".to_vec(),
        good.clone(),
        Vec::new(),
        good.clone(),
        b"\x89PNG\r\n\x1a\n and then nothing a PNG holds".to_vec(),
        good,
    ];
    let (got, stats) = collect(
        &m,
        stream,
        BatchPolicy {
            max_images: 3,
            max_patches: usize::MAX,
        },
    );
    assert_eq!(
        got.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
        (0..7).collect::<Vec<_>>()
    );
    for (i, r) in &got {
        match (i, r) {
            (1 | 3 | 5, Err(ModelError::Image { index, .. })) => assert_eq!(index, i),
            (0 | 2 | 4 | 6, Ok(e)) => assert!(!e.rows.is_empty()),
            (i, r) => panic!("image {i}: unexpected {:?}", r.as_ref().map(|e| &e.plan)),
        }
    }
    assert_eq!((stats.encoded, stats.failed), (4, 3));
}

#[test]
fn an_image_over_the_patch_ceiling_is_refused_by_its_index() {
    let m = open("glm5_next");
    let bytes: Vec<Vec<u8>> = ["tiny_20x15.png", "chelsea_168x112.webp", "tiny_20x15.png"]
        .iter()
        .map(|i| image(i))
        .collect();
    let (one, _) = collect(
        &m,
        bytes.clone(),
        BatchPolicy {
            max_images: 1,
            max_patches: usize::MAX,
        },
    );
    assert!(one.iter().all(|(_, r)| r.is_ok()));
    let (_, stats) = collect(
        &m,
        vec![bytes[0].clone()],
        BatchPolicy {
            max_images: 1,
            max_patches: usize::MAX,
        },
    );
    let small = stats.passes[0].patches;
    let (got, stats) = collect(
        &m,
        bytes,
        BatchPolicy {
            max_images: 4,
            max_patches: small,
        },
    );
    match &got[1] {
        (
            1,
            Err(ModelError::Tower(TowerError::OverPassCeiling {
                index: 1, ceiling, ..
            })),
        ) => assert_eq!(*ceiling, small),
        other => panic!("expected the ceiling's refusal of image 1, got {other:?}"),
    }
    assert!(got[0].1.is_ok() && got[2].1.is_ok());
    assert_eq!((stats.encoded, stats.failed), (2, 1));
}

#[test]
fn a_stream_pulls_a_bounded_number_of_images_ahead_of_its_results() {
    let m = open("gemma4");
    let bytes: Vec<Vec<u8>> = IMAGES.iter().map(|i| image(i)).collect();
    let pulled = AtomicUsize::new(0);
    const N: usize = 30;
    let max_images = 2;
    let stream = (0..N).map(|i| {
        pulled.fetch_add(1, Ordering::SeqCst);
        bytes[i % bytes.len()].clone()
    });
    let mut delivered = 0usize;
    let mut worst = 0usize;
    let stats = m
        .encode_stream(
            stream,
            BatchPolicy {
                max_images,
                max_patches: usize::MAX,
            },
            |i, r| {
                assert_eq!(i, delivered, "input order");
                assert!(r.is_ok(), "image {i}: {r:?}");
                delivered += 1;
                worst = worst.max(pulled.load(Ordering::SeqCst) - delivered);
            },
        )
        .expect("stream");
    assert_eq!(delivered, N);
    assert_eq!(stats.encoded, N);
    // The producer's chunk and open pass, one waiting, one staged, one in flight (module docs).
    let bound = 5 * max_images + 1;
    assert!(
        worst <= bound,
        "{worst} images pulled ahead of the results (bound {bound})"
    );
}

#[test]
fn an_empty_policy_is_refused_and_an_empty_stream_is_fine() {
    let m = open("gemma4");
    for policy in [
        BatchPolicy {
            max_images: 0,
            max_patches: 10,
        },
        BatchPolicy {
            max_images: 1,
            max_patches: 0,
        },
    ] {
        let r = m.encode_stream(Vec::<Vec<u8>>::new(), policy, |_, _| {});
        assert!(
            matches!(r, Err(ModelError::Tower(TowerError::Unsupported(_)))),
            "{r:?}"
        );
    }
    let mut calls = 0;
    let stats = m
        .encode_stream(Vec::<Vec<u8>>::new(), BatchPolicy::default(), |_, _| {
            calls += 1
        })
        .expect("empty stream");
    assert_eq!((calls, stats.encoded, stats.passes.len()), (0, 0, 0));
}
