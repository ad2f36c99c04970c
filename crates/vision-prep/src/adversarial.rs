//! Adversarial inputs: decompression bombs, lying headers, truncations, random bytes, hostile URIs.
//! Every case must end in a typed error (or a correct image), never a panic or an unbounded allocation.

use crate::error::PrepError;
use crate::source::{admit, decode, load, AdmissionLimits, ImageSource};
use crate::{ModelConfigs, PrepSettings, Preprocessor};

fn crc32(data: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn png_chunk(kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
    let mut v = (data.len() as u32).to_be_bytes().to_vec();
    let mut body = kind.to_vec();
    body.extend_from_slice(data);
    v.extend_from_slice(&body);
    v.extend_from_slice(&crc32(&body).to_be_bytes());
    v
}

/// A PNG whose IHDR says `w × h` (8-bit RGB), with the given IDAT payload.
pub(crate) fn png_with(w: u32, h: u32, idat: &[u8]) -> Vec<u8> {
    let mut ihdr = w.to_be_bytes().to_vec();
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    let mut v = b"\x89PNG\r\n\x1a\n".to_vec();
    v.extend(png_chunk(b"IHDR", &ihdr));
    v.extend(png_chunk(b"IDAT", idat));
    v.extend(png_chunk(b"IEND", &[]));
    v
}

/// A real, valid PNG of `w × h` black pixels (compresses to a few KB: a zlib bomb when relabelled).
pub(crate) fn black_png(w: u32, h: u32) -> Vec<u8> {
    let img = image::RgbImage::new(w, h);
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png)
        .expect("encode");
    out.into_inner()
}

fn idat_of(png: &[u8]) -> Vec<u8> {
    // Concatenate the IDAT payloads of a PNG we just encoded.
    let mut i = 8;
    let mut out = Vec::new();
    while i + 8 <= png.len() {
        let len = u32::from_be_bytes([png[i], png[i + 1], png[i + 2], png[i + 3]]) as usize;
        if &png[i + 4..i + 8] == b"IDAT" {
            out.extend_from_slice(&png[i + 8..i + 8 + len]);
        }
        i += 12 + len;
    }
    out
}

/// Headers of every format claiming sizes far over the budget: refused before any decode.
pub(crate) fn bomb_headers() -> Vec<(&'static str, Vec<u8>)> {
    let mut jpeg = vec![
        0xFF, 0xD8, 0xFF, 0xC0, 0x00, 0x11, 0x08, 0xFF, 0xFF, 0xFF, 0xFF, 0x03,
    ];
    jpeg.extend_from_slice(&[1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1, 0xFF, 0xD9]);
    let mut gif = b"GIF89a".to_vec();
    gif.extend_from_slice(&[0xFF, 0xFF, 0xFF, 0xFF, 0x00, 0, 0]);
    gif.extend_from_slice(&[
        0x2C, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 2, 2, 0x4C, 0x01, 0, 0x3B,
    ]);
    let mut bmp = b"BM".to_vec();
    bmp.extend_from_slice(&[0x36, 0, 0, 0, 0, 0, 0, 0, 0x36, 0, 0, 0, 40, 0, 0, 0]);
    bmp.extend_from_slice(&30000i32.to_le_bytes());
    bmp.extend_from_slice(&30000i32.to_le_bytes());
    bmp.extend_from_slice(&[1, 0, 24, 0, 0, 0, 0, 0]);
    bmp.extend_from_slice(&[0; 20]);
    // WebP VP8X: canvas 16384 × 16384 (stored minus one, 24-bit LE).
    let mut webp = b"RIFF".to_vec();
    webp.extend_from_slice(&30u32.to_le_bytes());
    webp.extend_from_slice(b"WEBPVP8X");
    webp.extend_from_slice(&10u32.to_le_bytes());
    webp.extend_from_slice(&[0, 0, 0, 0, 0xFF, 0x3F, 0x00, 0xFF, 0x3F, 0x00]);
    vec![
        (
            "png 100000x100000",
            png_with(
                100_000,
                100_000,
                &[0x78, 0x9C, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01],
            ),
        ),
        ("png 2^31x2^31", png_with(0x7FFF_FFFF, 0x7FFF_FFFF, &[])),
        ("jpeg 65535x65535", jpeg),
        ("gif 65535x65535", gif),
        ("bmp 30000x30000", bmp),
        ("webp 16384x16384", webp),
    ]
}

#[test]
fn bombs_are_refused_from_the_header() {
    let limits = AdmissionLimits::default();
    for (name, bytes) in bomb_headers() {
        match admit(&bytes, &limits) {
            Err(PrepError::OverBudget { .. }) => {}
            // A header the parser cannot even read is refused too, still before any pixel.
            Err(PrepError::Decode { .. }) => eprintln!("{name}: refused as unreadable header"),
            other => panic!("{name}: expected OverBudget, got {other:?}"),
        }
    }
}

#[test]
fn zero_sized_and_not_images() {
    let limits = AdmissionLimits::default();
    let zero = png_with(0, 10, &[]);
    assert!(matches!(
        admit(&zero, &limits),
        Err(PrepError::ZeroSized { .. } | PrepError::Decode { .. })
    ));
    assert!(matches!(
        admit(b"hello world, not an image", &limits),
        Err(PrepError::NotAnImage(_))
    ));
    assert!(matches!(admit(&[], &limits), Err(PrepError::NotAnImage(_))));
    // TIFF magic: a real image format we do not decode.
    assert!(matches!(
        admit(b"II*\x00\x08\x00\x00\x00", &limits),
        Err(PrepError::UnsupportedFormat(_))
    ));
}

/// A small header over a huge body: a valid 4000×4000 black PNG stream relabelled 16×16.
/// The decoder stops at the admitted size; memory stays bounded.
#[test]
fn small_header_over_huge_body() {
    let big = black_png(4000, 4000);
    let idat = idat_of(&big);
    let liar = png_with(16, 16, &idat);
    let limits = AdmissionLimits::default();
    let h = admit(&liar, &limits).expect("admitted as 16x16");
    assert_eq!((h.width, h.height), (16, 16));
    match decode(&liar, &h) {
        Ok(img) => assert_eq!((img.width, img.height), (16, 16)),
        Err(PrepError::Decode { .. }) => {}
        Err(e) => panic!("unexpected {e}"),
    }
    // And the honest 4000x4000 stream is refused under a 10 MP budget before decoding.
    let small_budget = AdmissionLimits {
        max_pixels: 10_000_000,
        ..Default::default()
    };
    assert!(matches!(
        admit(&big, &small_budget),
        Err(PrepError::OverBudget { .. })
    ));
}

/// Every decode fixture truncated at many offsets: typed error or a correct-size image, never a panic.
#[test]
fn truncated_files_never_panic() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/prep/decode");
    let mut n = 0;
    let mut errors = 0;
    for entry in std::fs::read_dir(dir).expect("decode fixtures").flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if name.ends_with(".json") || name.contains(".expected.") {
            continue;
        }
        let bytes = std::fs::read(entry.path()).expect("read");
        let mut cuts: Vec<usize> = (0..64.min(bytes.len())).collect();
        cuts.extend((1..40).map(|k| bytes.len() * k / 40));
        for cut in cuts {
            n += 1;
            match load(
                ImageSource::Bytes(&bytes[..cut]),
                &AdmissionLimits::default(),
            ) {
                Ok((h, img)) => assert_eq!(
                    (img.width, img.height),
                    (h.width as usize, h.height as usize)
                ),
                Err(_) => errors += 1,
            }
        }
    }
    eprintln!("truncations: {n} cases, {errors} typed errors, rest decoded to the admitted size");
    assert!(n > 1000);
}

/// Random bytes, and random bytes behind real magic numbers.
#[test]
fn random_bytes_never_panic() {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let magics: [&[u8]; 6] = [
        b"",
        b"\x89PNG\r\n\x1a\n",
        b"\xFF\xD8\xFF",
        b"GIF89a",
        b"BM",
        b"RIFF\x00\x00\x00\x00WEBPVP8 ",
    ];
    for i in 0..3000 {
        let len = (next() % 512) as usize;
        let mut bytes = magics[i % magics.len()].to_vec();
        bytes.extend((0..len).map(|_| next() as u8));
        let _ = load(ImageSource::Bytes(&bytes), &AdmissionLimits::default());
    }
}

#[test]
fn hostile_uris() {
    assert!(
        matches!(ImageSource::parse_uri("http://example.com/a.png"), Err(PrepError::SchemeRefused(s)) if s == "http")
    );
    assert!(matches!(
        ImageSource::parse_uri("HTTPS://x/y"),
        Err(PrepError::SchemeRefused(_))
    ));
    assert!(matches!(
        ImageSource::parse_uri("file:///etc/passwd"),
        Err(PrepError::SchemeRefused(_))
    ));
    assert!(matches!(
        ImageSource::parse_uri("/tmp/a.png"),
        Err(PrepError::SchemeRefused(_))
    ));
    let limits = AdmissionLimits {
        max_data_uri_bytes: 1000,
        ..Default::default()
    };
    let long = format!("data:image/png;base64,{}", "A".repeat(2000));
    assert!(matches!(
        ImageSource::DataUri(&long).bytes(&limits),
        Err(PrepError::DataUriTooLarge {
            len: 2022,
            cap: 1000
        })
    ));
    assert!(matches!(
        ImageSource::DataUri("data:image/png,abc").bytes(&limits),
        Err(PrepError::BadDataUri(_))
    ));
    assert!(matches!(
        ImageSource::DataUri("data:image/png;base64,!!!!").bytes(&limits),
        Err(PrepError::BadDataUri(_))
    ));
    assert!(matches!(
        ImageSource::DataUri("data:image/png;base64").bytes(&limits),
        Err(PrepError::BadDataUri(_))
    ));
    // A data URI that lies about its MIME type is judged by its bytes.
    let uri = "data:image/png;base64,aGVsbG8gd29ybGQ="; // "hello world"
    assert!(matches!(
        load(ImageSource::parse_uri(uri).expect("data"), &limits),
        Err(PrepError::NotAnImage(_))
    ));
    // A real PNG in a data URI (MIME says jpeg) decodes.
    use base64::Engine;
    let png = black_png(3, 2);
    let uri = format!(
        "data:image/jpeg;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(&png)
    );
    let (h, _) = load(
        ImageSource::parse_uri(&uri).expect("data"),
        &AdmissionLimits::default(),
    )
    .expect("png in data uri");
    assert_eq!((h.width, h.height), (3, 2));
}

/// step3p7 on a 60000×32 image plans 3024 crops (9 GB of f32): refused by the output budget, planned fine.
#[test]
fn output_budget_refuses_crop_explosions() {
    let cfg = ModelConfigs {
        preprocessor_config: Some(
            serde_json::json!({"image_processor_type": "Step3p7ImageProcessor"}),
        ),
        ..Default::default()
    };
    let pre = Preprocessor::from_configs(&cfg, PrepSettings::default()).expect("step");
    let plan = pre.plan_size(60000, 32).expect("plan");
    assert!(plan.output_bytes() > PrepSettings::default().max_output_bytes);
    let img = crate::RgbImage {
        width: 60000,
        height: 32,
        data: vec![0; 60000 * 32 * 3],
    };
    assert!(matches!(
        pre.prepare_rgb(&img),
        Err(PrepError::OutputTooLarge { .. })
    ));
}

#[test]
fn unknown_processor_class_is_typed() {
    let cfg = ModelConfigs {
        preprocessor_config: Some(
            serde_json::json!({"image_processor_type": "SiglipImageProcessor"}),
        ),
        ..Default::default()
    };
    assert!(
        matches!(Preprocessor::from_configs(&cfg, PrepSettings::default()), Err(PrepError::UnknownProcessor(c)) if c == "SiglipImageProcessor")
    );
    let bad = ModelConfigs {
        preprocessor_config: Some(
            serde_json::json!({"image_processor_type": "Gemma4ImageProcessor", "max_soft_tokens": 100}),
        ),
        ..Default::default()
    };
    assert!(matches!(
        Preprocessor::from_configs(&bad, PrepSettings::default()),
        Err(PrepError::BadSetting(_))
    ));
}

/// step3p7 `size` 0 and 2³²−1 are config errors at construction, not a resize of nothing or an
/// overflow of 3·side² at prepare time.
#[test]
fn step3p7_global_view_size_is_bounded() {
    for side in [
        0u64,
        (1 << 32) - 1,
        u64::from(crate::config::MAX_CONFIG_SIDE) + 1,
    ] {
        let cfg = ModelConfigs {
            preprocessor_config: Some(serde_json::json!({
                "image_processor_type": "Step3p7ImageProcessor",
                "size": {"height": side, "width": side}})),
            ..Default::default()
        };
        let got = Preprocessor::from_configs(&cfg, PrepSettings::default());
        assert!(
            matches!(got, Err(PrepError::Config { .. })),
            "{side}: {got:?}"
        );
    }
}

/// A step3p7 crop side far below `max_image_size` tiled the image into hundreds of thousands of
/// crops, each with its prompt runs (a cloned token per run), before any budget applied: the
/// `configs` fuzzer's `"patch_size": 1` planned 2000×2000 into 4 M crops and 1.3 GB of runs.
#[test]
fn step3p7_crop_count_is_bounded() {
    let with = |patch: u32| {
        let cfg = ModelConfigs {
            preprocessor_config: Some(serde_json::json!({
                "image_processor_type": "Step3p7ImageProcessor",
                "patch_size": patch})),
            ..Default::default()
        };
        Preprocessor::from_configs(&cfg, PrepSettings::default()).expect("valid config")
    };
    // 800×800 in 2-pixel windows: 400² = 160 000 crops.
    let got = with(2).plan_size(800, 800);
    assert!(
        matches!(got, Err(PrepError::Unplannable { .. })),
        "{:?}",
        got.map(|p| p.grid())
    );
    // The release crop side, and the most crops it gives: 1-pixel windows along a 3024 strip.
    assert_eq!(
        with(504).plan_size(3024, 3024).expect("release").grid(),
        vec![6, 6]
    );
    assert_eq!(
        with(504).plan_size(60000, 32).expect("strip").grid(),
        vec![1, 3024]
    );
}

/// A GGUF patch size meets the bounds a processor config's does (it used to overflow
/// `gemma4_target`'s `max_patches·p²`).
#[test]
fn gemma4_gguf_patch_size_is_bounded() {
    let with = |p: u32| {
        let g = crate::GgufGemma4Settings {
            patch_size: Some(p),
            ..Default::default()
        };
        Preprocessor::gemma4_gguf(&g, PrepSettings::default())
    };
    // 0, over MAX_CONFIG_SIDE, and 2000 (k·p = 6000 over MAX_ALIGN_FACTOR).
    for p in [0, u32::MAX, crate::config::MAX_CONFIG_SIDE + 1, 2000] {
        let got = with(p);
        assert!(matches!(got, Err(PrepError::Config { .. })), "{p}: {got:?}");
    }
    let pre = with(16).expect("the release patch size");
    assert!(pre.plan_size(640, 480).is_ok());
}

/// A step3p7 plan whose sides were never bounded (a law built by hand) saturates its byte count
/// instead of overflowing: it is over any budget.
#[test]
fn output_bytes_saturate() {
    let law = crate::Law::Step3p7(crate::law::Step3p7Law {
        image_size: u32::MAX,
        ..Default::default()
    });
    let step = ModelConfigs {
        preprocessor_config: Some(
            serde_json::json!({"image_processor_type": "Step3p7ImageProcessor"}),
        ),
        ..Default::default()
    };
    let tokens = Preprocessor::from_configs(&step, PrepSettings::default())
        .expect("step")
        .tokens()
        .clone();
    let pre = Preprocessor::from_law(law, tokens, crate::Family::Step3p7, PrepSettings::default());
    let plan = pre
        .plan_size(64, 64)
        .expect("a plan for a 2^32 - 1 view side");
    assert!(plan.output_bytes() > PrepSettings::default().max_output_bytes);
}
