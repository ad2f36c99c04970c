//! `vtower plan` and `vtower prep` against the upstream processor's fixtures: the prompt token
//! runs of every processor case and their embedding flags equal upstream's, and bad images are
//! refused in one line.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn fixture_meta(path: &Path) -> Value {
    let ck = st_reader::Checkpoint::open(path).unwrap();
    serde_json::from_str(ck.metadata().get("fixture").unwrap()).unwrap()
}

fn vtower(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_vtower"))
        .args(args)
        .output()
        .unwrap()
}

/// The step3p7 processor-only cases ran upstream's processor at the real sizes (no tower): a
/// copy of the tiny repo whose preprocessor config carries those sizes.
fn real_size_step_repo(processor: &Value) -> PathBuf {
    let src = fixtures().join("models/step3p7");
    let dir = std::env::temp_dir().join(format!("vtower-step-real-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "tokenizer_config.json", "model.safetensors"] {
        let _ = std::fs::remove_file(dir.join(f));
        std::os::unix::fs::symlink(src.join(f), dir.join(f)).unwrap();
    }
    let mut pre: Value = serde_json::from_str(
        &std::fs::read_to_string(src.join("preprocessor_config.json")).unwrap(),
    )
    .unwrap();
    for (k, v) in processor.as_object().unwrap() {
        pre[k] = v.clone();
    }
    std::fs::write(dir.join("preprocessor_config.json"), pre.to_string()).unwrap();
    dir
}

#[test]
fn plan_prompt_runs_equal_upstream_for_every_processor_case() {
    let mut checked = 0;
    for variant in std::fs::read_dir(fixtures().join("outputs")).unwrap() {
        for case in std::fs::read_dir(variant.unwrap().path()).unwrap() {
            let path = case.unwrap().path();
            let meta = fixture_meta(&path);
            if meta["prompt_plan"].is_null() || meta["images"].is_null() {
                // crafted tower inputs (glm5_next video_t2), and the video cases (frames, not
                // images: tests/video.rs)
                continue;
            }
            let images = meta["images"].as_array().unwrap();
            let model = match meta["model"].as_str().unwrap() {
                "" => real_size_step_repo(&meta["processor"]),
                m => fixtures().join(m),
            };
            for (image, upstream) in images.iter().zip(meta["prompt_plan"].as_array().unwrap()) {
                let image = fixtures().join("images").join(image.as_str().unwrap());
                let out = vtower(&[
                    "plan",
                    "--model",
                    model.to_str().unwrap(),
                    image.to_str().unwrap(),
                ]);
                assert!(
                    out.status.success(),
                    "{}: {}",
                    path.display(),
                    String::from_utf8_lossy(&out.stderr)
                );
                let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
                // Upstream's runs as [id, count], adjacent equal ids merged (glm's image wrappers
                // come from the chat template, not the processor: keep only the image token).
                let mut want: Vec<(u64, u64)> = Vec::new();
                for run in upstream.as_array().unwrap() {
                    let (id, count) = (run["id"].as_u64().unwrap(), run["count"].as_u64().unwrap());
                    match want.last_mut() {
                        Some(last) if last.0 == id => last.1 += count,
                        _ => want.push((id, count)),
                    }
                }
                let got: Vec<(u64, u64)> = plan["prompt_runs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| (r[0].as_u64().unwrap(), r[1].as_u64().unwrap()))
                    .collect();
                if plan["family"].as_str().unwrap().starts_with("glm") {
                    let image_id = got[0].0;
                    want.retain(|(id, _)| *id == image_id);
                }
                assert_eq!(got, want, "{} on {}", path.display(), image.display());
                // Upstream's model embeds the positions where `input_ids == image_token_id`
                // (`get_placeholder_mask`), the id from the model's config.json.
                let config: Value = serde_json::from_str(
                    &std::fs::read_to_string(model.join("config.json")).unwrap(),
                )
                .unwrap();
                let image_id = config["image_token_id"]
                    .as_u64()
                    .or_else(|| config["text_config"]["image_token_id"].as_u64())
                    .unwrap();
                let want_embeds: Vec<bool> = want.iter().map(|(id, _)| *id == image_id).collect();
                let got_embeds: Vec<bool> = plan["prompt_embeds"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|b| b.as_bool().unwrap())
                    .collect();
                assert_eq!(
                    got_embeds,
                    want_embeds,
                    "prompt_embeds: {} on {}",
                    path.display(),
                    image.display()
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 20, "only {checked} plans checked");
}

#[test]
fn prep_writes_the_upstream_tensor_names() {
    let out = std::env::temp_dir().join(format!("vtower-prep-{}.safetensors", std::process::id()));
    for (model, names) in [
        ("models/gemma4", vec!["image_position_ids", "pixel_values"]),
        ("models/glm5_next", vec!["image_grid_thw", "pixel_values"]),
        (
            "models/step3p7",
            vec![
                "num_local_patches",
                "patch_newline_masks",
                "pixel_values",
                "pixel_values_local",
            ],
        ),
    ] {
        let image = fixtures().join("images/astronaut_336x224.jpg");
        let o = vtower(&[
            "prep",
            "--model",
            fixtures().join(model).to_str().unwrap(),
            image.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(
            o.status.success(),
            "{model}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let ck = st_reader::Checkpoint::open(&out).unwrap();
        let got: Vec<&str> = ck.tensors().map(|t| t.name.as_str()).collect();
        assert_eq!(got, names, "{model}");
    }
    let _ = std::fs::remove_file(out);
}

#[test]
fn bad_images_are_refused_in_one_line() {
    let dir = std::env::temp_dir().join(format!("vtower-badimg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let png = std::fs::read(fixtures().join("images/tiny_20x15.png")).unwrap();
    let mut bomb = png.clone();
    // IHDR width/height (bytes 16..24) claim 100000 × 100000 pixels.
    bomb[16..20].copy_from_slice(&100_000u32.to_be_bytes());
    bomb[20..24].copy_from_slice(&100_000u32.to_be_bytes());
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("truncated.png", png[..png.len() / 2].to_vec()),
        ("bomb.png", bomb),
        (
            "random.bin",
            (0..4096u32)
                .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8)
                .collect(),
        ),
        ("empty.png", vec![]),
    ];
    let model = fixtures().join("models/gemma4");
    for (name, bytes) in cases {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        for cmd in ["plan", "prep"] {
            let mut args = vec![
                cmd,
                "--model",
                model.to_str().unwrap(),
                path.to_str().unwrap(),
            ];
            let out_path = dir.join("out.safetensors");
            if cmd == "prep" {
                args.extend(["--out", out_path.to_str().unwrap()]);
            }
            let o = vtower(&args);
            let stderr = String::from_utf8_lossy(&o.stderr);
            if cmd == "plan" && name == "truncated.png" {
                // The header is intact: planning needs only the header.
                assert!(o.status.success(), "{stderr}");
                continue;
            }
            assert_eq!(o.status.code(), Some(1), "{cmd} {name}: {stderr}");
            assert_eq!(stderr.lines().count(), 1, "{cmd} {name}: {stderr}");
            assert!(stderr.contains(name), "{cmd} {name}: {stderr}");
        }
    }
    for uri in [
        "https://example.com/cat.png",
        "file:///etc/passwd",
        "data:image/png;base64,!!!notbase64",
    ] {
        let o = vtower(&["plan", "--model", model.to_str().unwrap(), uri]);
        assert_eq!(o.status.code(), Some(1), "{uri}");
        assert_eq!(String::from_utf8_lossy(&o.stderr).lines().count(), 1);
    }
    let _ = std::fs::remove_dir_all(dir);
}
