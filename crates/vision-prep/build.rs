//! Says loudly when libjpeg-turbo was built without its SIMD code.
//!
//! `mozjpeg-sys` (`links = "jpeg"`) builds libjpeg-turbo's x86 SIMD only where `nasm` runs at
//! build time; without it the build succeeds on the C code alone, JPEG decoding is about 2×
//! slower (docs/PERF.md v0.5, v0.8), and its own warning is hidden because cargo shows the
//! warnings of path crates only. Its build script writes the `jconfig.h` it compiled with and
//! passes the directory on (`DEP_JPEG_INCLUDE`): this reads `WITH_SIMD` from there, so the
//! warning tells what was built, not a guess about the PATH.
//!
//! What it found is compiled in as `vision_prep::JPEG_SIMD`, so a timing run can say which
//! decoder it measured.
//!
//! `VT_REQUIRE_JPEG_SIMD=1` turns the warning into a build failure: the release builds of what
//! ships (`cargo xtask test`'s wheel and `cargo xtask dist`) set it.
use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=DEP_JPEG_INCLUDE");
    println!("cargo:rerun-if-env-changed=VT_REQUIRE_JPEG_SIMD");
    let jconfig = std::env::var_os("DEP_JPEG_INCLUDE").and_then(|include| {
        std::env::split_paths(&include)
            .map(|dir| dir.join("jconfig.h"))
            .find(|p| p.is_file())
    });
    let simd = jconfig.as_ref().and_then(|p| {
        std::fs::read_to_string(p)
            .ok()
            .map(|text| text.lines().any(|l| l.trim() == "#define WITH_SIMD 1"))
    });
    // What `vision_prep::JPEG_SIMD` reports: "1", "0", or "" where the header was not found.
    let spelled = match simd {
        Some(true) => "1",
        Some(false) => "0",
        None => "",
    };
    println!("cargo:rustc-env=VT_JPEG_SIMD={spelled}");
    let Some(jconfig) = jconfig else {
        return;
    };
    if simd == Some(false) {
        warn(&jconfig);
        if std::env::var_os("VT_REQUIRE_JPEG_SIMD").is_some_and(|v| v == "1") {
            eprintln!(
                "VT_REQUIRE_JPEG_SIMD=1: refusing to build vision-prep on libjpeg-turbo without \
                 SIMD ({}); install nasm and `cargo clean -p mozjpeg-sys`",
                jconfig.display()
            );
            std::process::exit(1);
        }
    }
}

fn warn(jconfig: &Path) {
    let lines = [
        "################################################################################",
        "JPEG WITHOUT SIMD: libjpeg-turbo (mozjpeg-sys) was built without its SIMD code",
        "because `nasm` was not on the PATH; JPEG decoding runs about 2x slower.",
        "Install nasm (Debian/Ubuntu: `apt-get install nasm`; Fedora: `dnf install nasm`;",
        "macOS: `brew install nasm`) and rebuild from clean (`cargo clean -p mozjpeg-sys`).",
        "################################################################################",
    ];
    for line in lines {
        println!("cargo:warning={line}");
    }
    println!("cargo:warning=(from {})", jconfig.display());
}
