//! The resize against torchvision's outputs and its own laws (the AVX2 twins equal the portable
//! path byte for byte).

use super::*;

/// Every kernel set this CPU can run: the portable one, and AVX2 where detected.
fn all_kernels() -> Vec<Kernels> {
    let mut k = vec![Kernels::Portable];
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        k.push(Kernels::Avx2);
    }
    k
}

#[allow(clippy::too_many_arguments)]
fn resize_with(
    k: Kernels,
    src: &[u8],
    sw: usize,
    sh: usize,
    w: usize,
    h: usize,
    f: Filter,
    parallel: bool,
) -> Vec<u8> {
    resize_c::<3>(k, src, sw, sh, w, h, f, parallel, Scratch::none())
}

/// The AVX2 kernels equal the portable ones byte for byte on random images: sizes 1..400 up and
/// down (so every tap count mod 4, row tails, and pixels whose 16-byte load would leave the
/// buffer), extreme ratios, both filters. The portable kernels equal torchvision (fixtures below).
#[test]
fn kernels_agree_on_random_images() {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let kernels = all_kernels();
    let mut cases = vec![
        (1, 1, 3, 2),
        (2, 1, 1, 1),
        (600, 2, 3, 5),
        (3, 700, 2, 9),
        (997, 13, 31, 7),
    ];
    for _ in 0..120 {
        let d = |n: &mut dyn FnMut() -> u64| 1 + (n() % 400) as usize;
        cases.push((d(&mut next), d(&mut next), d(&mut next), d(&mut next)));
    }
    for (sw, sh, w, h) in cases {
        let src: Vec<u8> = (0..sw * sh * 3).map(|_| next() as u8).collect();
        for f in [Filter::Bicubic, Filter::Bilinear] {
            let want = resize_with(Kernels::Portable, &src, sw, sh, w, h, f, false);
            for &k in &kernels[1..] {
                let got = resize_with(k, &src, sw, sh, w, h, f, false);
                assert!(got == want, "{k:?} {sw}x{sh} -> {w}x{h} {f:?}");
            }
        }
    }
}

/// The quad kernel takes the triangle filter's upscaling (step3p7's crop image, 1920 → 2016
/// wide) and nothing with more than 2 taps; where it runs, its bytes equal the portable ones,
/// rows in pairs and alone, widths off a multiple of 4 and loads near the buffer's end included.
#[cfg(target_arch = "x86_64")]
#[test]
fn quad_kernel_takes_two_tap_axes() {
    let plan = |i, o, f| avx2::QuadPlan::new(&AxisWeights::new(i, o, f)).is_some();
    assert!(plan(1920, 2016, Filter::Bilinear));
    assert!(plan(3, 7, Filter::Bilinear));
    assert!(!plan(1920, 728, Filter::Bilinear), "downscale: 7 taps");
    assert!(!plan(640, 728, Filter::Bicubic), "bicubic: 4 taps");
    assert!(
        !plan(5, 3, Filter::Bilinear),
        "fewer than 4 outputs: no quad"
    );
    if !has_avx2() {
        return;
    }
    for (sw, sh, w, h) in [
        (1920, 9, 2016, 8),
        (5, 3, 7, 3),
        (37, 4, 38, 4),
        (64, 2, 130, 5),
        (9, 1, 16, 1),
    ] {
        assert!(plan(sw, w, Filter::Bilinear), "{sw} -> {w}");
        let src: Vec<u8> = (0..sw * sh * 3).map(|i| (i * 7919 % 253) as u8).collect();
        let want = resize_with(
            Kernels::Portable,
            &src,
            sw,
            sh,
            w,
            h,
            Filter::Bilinear,
            false,
        );
        let got = resize_with(Kernels::Avx2, &src, sw, sh, w, h, Filter::Bilinear, false);
        assert!(got == want, "{sw}x{sh} -> {w}x{h}");
    }
}

/// The shared horizontal pass gives each height what a separate resize gives.
#[test]
fn shared_horizontal_pass_equals_separate_resizes() {
    let (sw, sh) = (301, 203);
    let src: Vec<u8> = (0..sw * sh * 3).map(|i| (i * 7919 % 251) as u8).collect();
    for (w, hs) in [
        (226, vec![150, 203, 57]),
        (301, vec![203, 400]),
        (640, vec![9, 203]),
    ] {
        for f in [Filter::Bicubic, Filter::Bilinear] {
            let got = resize_rgb_heights(&src, sw, sh, w, &hs, f, false, Scratch::none());
            for (&h, g) in hs.iter().zip(&got) {
                assert!(
                    **g == *resize_rgb(&src, sw, sh, w, h, f, false).expect("sizes"),
                    "{w}x{h} {f:?}"
                );
            }
        }
    }
}

/// A source of another length than `src_w·src_h·3`, or a zero or overflowing size, is an
/// error before anything is read, on every path (height only, where the AVX2 kernel once read
/// past a short slice by `src_h`; width only; both; identity).
#[test]
fn resize_rgb_refuses_a_source_of_the_wrong_length() {
    let (sw, sh) = (64, 64);
    let full = vec![7u8; sw * sh * 3];
    for src in [&full[..sw * 8 * 3], &full[..full.len() - 1], &full[..0]] {
        for (w, h) in [(64, 32), (32, 64), (32, 32), (64, 64), (65, 200)] {
            for f in [Filter::Bicubic, Filter::Bilinear] {
                match resize_rgb(src, sw, sh, w, h, f, false) {
                    Err(PrepError::BadSetting(m)) => {
                        assert!(m.contains(&format!("{} bytes for 64x64", src.len())), "{m}")
                    }
                    other => panic!("{} bytes -> {w}x{h}: {other:?}", src.len()),
                }
            }
        }
    }
    let long = vec![7u8; sw * sh * 3 + 3];
    assert!(matches!(
        resize_rgb(&long, sw, sh, 32, 32, Filter::Bicubic, false),
        Err(PrepError::BadSetting(_))
    ));
    for (a, b, c, d) in [(0, 4, 4, 4), (4, 0, 4, 4), (4, 4, 0, 4), (4, 4, 4, 0)] {
        let src = vec![0u8; a * b * 3];
        assert!(matches!(
            resize_rgb(&src, a, b, c, d, Filter::Bicubic, false),
            Err(PrepError::BadSetting(_))
        ));
    }
    // sizes whose byte count wraps: an error, not a wrapped length that matches
    let wraps = (usize::MAX / 3 + 1, 1);
    assert!(matches!(
        resize_rgb(&[], wraps.0, wraps.1, 1, 1, Filter::Bicubic, false),
        Err(PrepError::BadSetting(_))
    ));
    assert!(matches!(
        resize_rgb(&full, sw, sh, usize::MAX, 2, Filter::Bicubic, false),
        Err(PrepError::BadSetting(_))
    ));
}

/// The unsafe vertical kernel checks its own rows: handed a source shorter than its weights
/// read (a caller's bug, unreachable through [`resize_rgb`]), the pass takes the portable
/// kernel, whose checked indexing stops it, instead of reading past the slice.
#[test]
fn vertical_pass_never_reads_past_its_source() {
    let (w, sh, oh) = (64, 64, 32);
    let av = AxisWeights::new(sh, oh, Filter::Bicubic);
    let short = vec![7u8; w * 3 * 8];
    assert!(!vertical_fits(
        &short,
        0,
        w * 3,
        &av,
        &vec![0u8; w * 3 * oh]
    ));
    let full = vec![7u8; w * 3 * sh];
    assert!(vertical_fits(&full, 0, w * 3, &av, &vec![0u8; w * 3 * oh]));
    for k in all_kernels() {
        let ran = std::panic::catch_unwind(|| {
            let mut dst = vec![0u8; w * 3 * oh];
            vertical(k, &short, 0, w * 3, &av, &mut dst, false);
        });
        assert!(ran.is_err(), "{k:?} read a 64-row pass from 8 rows");
    }
}

#[test]
fn identity_when_same_size() {
    let src: Vec<u8> = (0..5 * 4 * 3).map(|i| (i * 7 % 256) as u8).collect();
    assert_eq!(
        resize_rgb(&src, 5, 4, 5, 4, Filter::Bicubic, false).expect("sizes"),
        src
    );
    // Into a kept buffer that held other bytes, larger and smaller than the image.
    let scratch = crate::pages::Scratch::new(1 << 20);
    for stale in [vec![0xAB; src.len() + 17], vec![0xCD; 7]] {
        scratch.give(stale);
        assert_eq!(
            resize_rgb_in(&src, 5, 4, 5, 4, Filter::Bicubic, false, &scratch),
            src
        );
    }
}

fn fixture_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/prep/resize")
}

fn load_png(path: &std::path::Path) -> (usize, usize, Vec<u8>) {
    let img = image::open(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .to_rgb8();
    (img.width() as usize, img.height() as usize, img.into_raw())
}

/// `prep_resize.py` checksum: Σ byte_i·(i mod 65521 + 1), wrapping u64.
fn checksum(data: &[u8]) -> u64 {
    data.iter().enumerate().fold(0u64, |acc, (i, &v)| {
        acc.wrapping_add(u64::from(v).wrapping_mul((i % 65521) as u64 + 1))
    })
}

/// `prep_resize.py` formula source image.
pub(crate) fn formula_image(w: usize, h: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(w * h * 3);
    for y in 0..h as i64 {
        for x in 0..w as i64 {
            for c in 0..3i64 {
                out.push(((x * 7 + y * 13 + c * 50 + ((x * y) >> 5) + ((x ^ y) & 31)) & 255) as u8);
            }
        }
    }
    out
}

/// Bound: EXACT (max diff 0 on every pixel) against torchvision 0.29.2 / torch 2.15 CPU
/// `resize(uint8, antialias=True)`, bicubic and bilinear, up and down, extreme ratios.
#[test]
fn bit_exact_against_torchvision() {
    let dir = fixture_dir();
    let text = std::fs::read_to_string(dir.join("cases.json")).expect("cases.json");
    let table: serde_json::Value = serde_json::from_str(&text).expect("json");
    let mut total = 0usize;
    let mut exact = 0usize;
    let mut max_diff = 0u8;
    let mut bad = Vec::new();
    for case in table["cases"].as_array().expect("cases") {
        let (sw, sh, src) = load_png(&dir.join(case["src"].as_str().expect("src")));
        let (ew, eh, expected) = load_png(&dir.join(case["out"].as_str().expect("out")));
        let filter = if case["mode"] == "bicubic" {
            Filter::Bicubic
        } else {
            Filter::Bilinear
        };
        for &k in &all_kernels()[1..] {
            if resize_with(k, &src, sw, sh, ew, eh, filter, false) != expected {
                bad.push(format!("{k:?} {} -> {ew}x{eh}: differs", case["src"]));
            }
        }
        let got = resize_with(Kernels::Portable, &src, sw, sh, ew, eh, filter, false);
        let d = got
            .iter()
            .zip(&expected)
            .map(|(a, b)| a.abs_diff(*b))
            .max()
            .unwrap_or(0);
        total += got.len();
        exact += got.iter().zip(&expected).filter(|(a, b)| a == b).count();
        max_diff = max_diff.max(d);
        if d > 0 {
            bad.push(format!(
                "{} -> {}x{} {}: max diff {d}",
                case["src"], ew, eh, case["mode"]
            ));
        }
    }
    for case in table["formula_cases"].as_array().expect("formula") {
        let g = |k: &str| case[k].as_u64().expect("size") as usize;
        let src = formula_image(g("src_width"), g("src_height"));
        let filter = if case["mode"] == "bicubic" {
            Filter::Bicubic
        } else {
            Filter::Bilinear
        };
        let want: u64 = case["checksum"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .expect("checksum");
        for k in all_kernels() {
            let got = resize_with(
                k,
                &src,
                g("src_width"),
                g("src_height"),
                g("width"),
                g("height"),
                filter,
                true,
            );
            if checksum(&got) == want {
                continue;
            }
            bad.push(format!(
                "{k:?} formula {}x{} -> {}x{} {}: checksum differs",
                g("src_width"),
                g("src_height"),
                g("width"),
                g("height"),
                case["mode"]
            ));
        }
    }
    eprintln!("resize: {exact}/{total} bytes exact, max diff {max_diff}");
    assert!(bad.is_empty(), "{} cases differ: {:#?}", bad.len(), bad);
}
