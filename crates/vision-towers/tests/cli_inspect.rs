//! `vtower inspect` against files made by the real writers (gguf-py, safetensors) and the
//! upstream mini model repositories, and against a corpus of malformed files derived from them.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn vtower(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vtower"))
        .args(args)
        .output()
        .expect("vtower runs")
}

fn inspect(path: &Path) -> Value {
    let out = vtower(&["inspect", path.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object on stdout")
}

fn expected(kind: &str) -> Value {
    let p = fixtures().join("readers").join(kind).join("expected.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn tensor_map(v: &Value) -> Vec<(String, String, Vec<u64>)> {
    let mut t: Vec<_> = v["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let shape = t["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap())
                .collect();
            (
                t["name"].as_str().unwrap().to_string(),
                t["dtype"].as_str().unwrap().to_string(),
                shape,
            )
        })
        .collect();
    t.sort();
    t
}

#[test]
fn gguf_files_match_what_gguf_py_wrote() {
    let exp = expected("gguf");
    for file in exp["files"].as_array().unwrap() {
        let name = file["file"].as_str().unwrap();
        let got = inspect(&fixtures().join("readers/gguf").join(name));
        assert_eq!(got["format"], "gguf");
        // Tensors: dtype in ggml's spelling, shape outermost-first = ggml `ne` reversed.
        let mut want: Vec<_> = file["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                let mut ne: Vec<u64> = t["ne"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_u64().unwrap())
                    .collect();
                ne.reverse();
                (
                    t["name"].as_str().unwrap().to_string(),
                    t["ggml_type"].as_str().unwrap().to_string(),
                    ne,
                )
            })
            .collect();
        want.sort();
        assert_eq!(tensor_map(&got), want, "{name}");
        // Metadata: every key the writer wrote, by value (nested arrays too).
        let meta = got["metadata"].as_object().unwrap();
        for kv in file["metadata"].as_array().unwrap() {
            let key = kv["key"].as_str().unwrap();
            let value = meta
                .get(key)
                .unwrap_or_else(|| panic!("{name}: key {key} missing"));
            assert_typed_eq(value, kv, &format!("{name}: {key}"));
        }
    }
}

/// Compares an `inspect` value with gguf-py's typed record `{type, value}` or
/// `{type: "array", elem_type, values}`; long arrays are summarised as `{type, len}`.
fn assert_typed_eq(got: &Value, want: &Value, what: &str) {
    match want["type"].as_str().unwrap() {
        "array" => {
            let items = want["values"].as_array().unwrap();
            if items.len() > 64 {
                assert_eq!(got["len"].as_u64(), Some(items.len() as u64), "{what}");
                assert_eq!(got["type"], want["elem_type"], "{what}");
            } else {
                let got = got
                    .as_array()
                    .unwrap_or_else(|| panic!("{what}: not an array: {got}"));
                assert_eq!(got.len(), items.len(), "{what}");
                for (g, w) in got.iter().zip(items) {
                    assert_typed_eq(g, w, what);
                }
            }
        }
        "f32" | "f64" => {
            let (g, w) = (got.as_f64().unwrap(), want["value"].as_f64().unwrap());
            assert!((g - w).abs() <= 1e-7 * w.abs(), "{what}: {g} vs {w}");
        }
        _ => assert_eq!(got, &want["value"], "{what}"),
    }
}

#[test]
fn safetensors_single_directory_and_sharded_match_the_writer() {
    let exp = expected("safetensors");
    let files = exp["files"].as_object().unwrap();
    let want_of = |prefix: &str| {
        let mut want = Vec::new();
        for (file, entry) in files
            .iter()
            .filter(|(f, _)| f.starts_with(prefix) && f.ends_with(".safetensors"))
        {
            for (name, t) in entry["tensors"]
                .as_object()
                .unwrap_or_else(|| panic!("{file}"))
            {
                let shape = t["shape"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_u64().unwrap())
                    .collect();
                want.push((
                    name.clone(),
                    t["dtype"].as_str().unwrap().to_string(),
                    shape,
                ));
            }
        }
        want.sort();
        want
    };
    for (path, prefix) in [
        ("single.safetensors", "single"),
        ("model_dir", "model_dir/"),
        ("sharded", "sharded/"),
    ] {
        let got = inspect(&fixtures().join("readers/safetensors").join(path));
        assert_eq!(got["format"], "safetensors");
        assert_eq!(tensor_map(&got), want_of(prefix), "{path}");
    }
    let single = inspect(&fixtures().join("readers/safetensors/single.safetensors"));
    assert_eq!(
        single["metadata"]["__metadata__"],
        files["single.safetensors"]["metadata"]
    );
}

#[test]
fn families_of_the_upstream_mini_repositories() {
    for (path, family) in [
        ("models/gemma4", "gemma4"),
        ("models/gemma4_clipped", "gemma4"),
        ("models/gemma4_gguf/mmproj-BF16.gguf", "gemma4"),
        ("models/gemma4_gguf/mmproj-F16.gguf", "gemma4"),
        ("models/glm5_next", "glm5_next"),
        ("models/glm_ocr", "glm_ocr"),
        ("models/step3p7", "step3p7"),
        ("models/step3p7_sharded", "step3p7"),
        ("models/step3p7_hf", "step3p7"),
        ("readers/gguf/tiny_v3.gguf", "null"),
    ] {
        let got = inspect(&fixtures().join(path));
        assert_eq!(
            got["family"].to_string().trim_matches('"'),
            family,
            "{path}"
        );
    }
    let cfg = inspect(&fixtures().join("models/glm5_next"));
    assert_eq!(cfg["metadata"]["config.json"]["model_type"], "glm5_next");
}

/// Runs `inspect` on `bytes` written to a file: exit 0, or exit 1 with one line on stderr that
/// names the file. Never a panic (101) or a signal.
fn refuses_cleanly(dir: &Path, label: &str, bytes: &[u8]) -> bool {
    let path = dir.join(label);
    std::fs::write(&path, bytes).unwrap();
    let out = vtower(&["inspect", path.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(0) => {
            serde_json::from_slice::<Value>(&out.stdout).expect("success prints JSON");
            false
        }
        Some(1) => {
            assert_eq!(stderr.lines().count(), 1, "{label}: {stderr}");
            assert!(
                stderr.contains(label),
                "{label}: error does not name the file: {stderr}"
            );
            true
        }
        other => panic!("{label}: exit {other:?} (signal or panic): {stderr}"),
    }
}

#[test]
fn malformed_files_are_refused_cleanly() {
    let dir = std::env::temp_dir().join(format!("vtower-malformed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sources = [
        "readers/gguf/tiny_v3.gguf",
        "readers/safetensors/single.safetensors",
        "models/gemma4_gguf/mmproj-BF16.gguf",
    ];
    let mut refused = 0;
    for src in sources {
        let good = std::fs::read(fixtures().join(src)).unwrap();
        let stem = Path::new(src)
            .file_name()
            .unwrap()
            .to_string_lossy()
            .to_string();
        // Truncations: every byte of the first 64, then 40 spread over the file (never whole).
        let mut cuts: Vec<usize> = (0..64.min(good.len())).collect();
        cuts.extend((1..40).map(|i| i * good.len() / 40));
        for cut in cuts {
            assert!(
                refuses_cleanly(&dir, &format!("cut{cut}-{stem}"), &good[..cut]),
                "{stem} cut at {cut} was accepted"
            );
            refused += 1;
        }
        // Header byte flips (xorshift positions, deterministic): refused or accepted, never a crash.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for i in 0..40 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mut bad = good.clone();
            let at = (x as usize) % good.len().min(512);
            bad[at] ^= 1 << (x >> 60 & 7);
            if refuses_cleanly(&dir, &format!("flip{i}-{stem}"), &bad) {
                refused += 1;
            }
        }
    }
    for (label, bytes) in [
        ("empty.bin", Vec::new()),
        ("text.bin", b"hello world, not weights\n".to_vec()),
        ("ones.bin", vec![0xff; 4096]),
    ] {
        assert!(refuses_cleanly(&dir, label, &bytes), "{label} was accepted");
        refused += 1;
    }
    assert!(refused > 300, "only {refused} malformed files refused");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_directory_of_gguf_files_names_them() {
    let out = vtower(&[
        "inspect",
        fixtures().join("models/gemma4_gguf").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("mmproj-BF16.gguf"));
}
