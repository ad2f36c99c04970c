//! Peak resident memory (VmHWM) while refusing/decoding adversarial inputs, in a fresh process.
//!
//! `cargo run --release -p vision-prep --example peak_mem -- <case>` with case one of
//! `baseline | bombs | liar_png | budget_png`; prints `case VmHWM_kB`.

use vision_prep::source::{admit, decode, AdmissionLimits};

fn vm_hwm_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

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

fn black_png(w: u32, h: u32) -> Vec<u8> {
    let mut out = std::io::Cursor::new(Vec::new());
    image::RgbImage::new(w, h)
        .write_to(&mut out, image::ImageFormat::Png)
        .expect("encode");
    out.into_inner()
}

/// Rewrite the IHDR of a PNG to `w × h` (fixing the CRC).
fn relabel(mut png: Vec<u8>, w: u32, h: u32) -> Vec<u8> {
    png[16..20].copy_from_slice(&w.to_be_bytes());
    png[20..24].copy_from_slice(&h.to_be_bytes());
    let crc = crc32(&png[12..29]);
    png[29..33].copy_from_slice(&crc.to_be_bytes());
    png
}

fn main() {
    let case = std::env::args().nth(1).unwrap_or_else(|| "baseline".into());
    let limits = AdmissionLimits::default();
    match case.as_str() {
        "baseline" => {}
        "bombs" => {
            // 8000x8000 stream relabelled 60000x60000: refused from the header.
            let png = relabel(black_png(8000, 8000), 60000, 60000);
            let before = vm_hwm_kb();
            let r = admit(&png, &limits);
            println!(
                "bombs: {:?} (HWM before admit {before} kB)",
                r.err().map(|e| e.to_string())
            );
        }
        "liar_png" => {
            // A 8000x8000 zlib stream (64 M pixels of data) under a 16x16 header.
            let png = relabel(black_png(8000, 8000), 16, 16);
            let before = vm_hwm_kb();
            let h = admit(&png, &limits).expect("16x16");
            let r = decode(&png, &h);
            println!(
                "liar_png: {:?} (HWM before decode {before} kB)",
                r.map(|i| (i.width, i.height)).map_err(|e| e.to_string())
            );
        }
        "budget_png" => {
            // An honest 7000x7000 (49 MP) image: admitted and decoded.
            let png = black_png(7000, 7000);
            let before = vm_hwm_kb();
            let h = admit(&png, &limits).expect("admit");
            let r = decode(&png, &h).map(|i| (i.width, i.height));
            println!("budget_png: {r:?} (HWM before decode {before} kB)");
        }
        other => println!("unknown case {other}"),
    }
    println!("{case} VmHWM_kB {}", vm_hwm_kb());
}
