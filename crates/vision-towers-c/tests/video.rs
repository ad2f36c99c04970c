//! Video through the C ABI (`vt_model_plan_video`, `vt_model_encode_video`), through the C test
//! program against the Rust API: the upstream video tower cases
//! (`fixtures/outputs/glm5_next_video/fps1_odd7`, `gemma4_video/g4_n2`) from raw RGB frames and
//! from BMP files give rows bitwise `Model::encode_video`'s (library-allocated and, through
//! `vt_model_encode_video_into`, in the caller's buffer) and its plan (sampled frames, grid,
//! every prompt piece); the hostile videos (10 000 frames, 10⁹ pixels, no fps, a family without
//! video) give the documented status, with frames never read; and (valgrind present) the same
//! script under memcheck.

mod common;

use common::*;
use serde_json::Value;
use std::path::Path;
use vision_towers::vision_prep::video::VideoSettings;
use vision_towers::vision_prep::{PrepSettings, Video, VideoFrames, VideoMetadata, VideoPiece};
use vision_towers::{Device, EncodedVideo, Model, TowerOptions};

/// A video tower case: frames `[N, H, W, 3]` (raw bytes), its metadata, and the setting its
/// video processor config names (gemma4 `num_frames`).
struct Case {
    raw: Vec<u8>,
    n: usize,
    width: u32,
    height: u32,
    fps: f64,
    num_frames: u64,
}

/// The case's fixture, read with the safetensors header (JSON) alone.
fn case(name: &str) -> Case {
    let bytes = std::fs::read(fixtures().join(format!("outputs/{name}.safetensors"))).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let meta: Value =
        serde_json::from_str(header["__metadata__"]["fixture"].as_str().unwrap()).unwrap();
    let t = &header["frames_u8"];
    let shape: Vec<usize> = t["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    let (a, b) = (
        t["data_offsets"][0].as_u64().unwrap() as usize,
        t["data_offsets"][1].as_u64().unwrap() as usize,
    );
    Case {
        raw: bytes[8 + n + a..8 + n + b].to_vec(),
        n: shape[0],
        width: shape[2] as u32,
        height: shape[1] as u32,
        fps: meta["video_metadata"]["fps"].as_f64().unwrap(),
        num_frames: meta["video_processor_config"]["num_frames"]
            .as_u64()
            .unwrap_or(0),
    }
}

/// A 24-bit BMP of an RGB frame (bottom-up rows, BGR, rows padded to 4 bytes): lossless.
fn bmp(rgb: &[u8], w: u32, h: u32) -> Vec<u8> {
    let stride = (w as usize * 3).div_ceil(4) * 4;
    let size = 54 + stride * h as usize;
    let mut out = Vec::with_capacity(size);
    out.extend(b"BM");
    out.extend((size as u32).to_le_bytes());
    out.extend([0u8; 4]);
    out.extend(54u32.to_le_bytes());
    out.extend(40u32.to_le_bytes());
    out.extend((w as i32).to_le_bytes());
    out.extend((h as i32).to_le_bytes());
    out.extend(1u16.to_le_bytes());
    out.extend(24u16.to_le_bytes());
    out.extend([0u8; 24]);
    for y in (0..h as usize).rev() {
        let row = &rgb[y * w as usize * 3..(y + 1) * w as usize * 3];
        let start = out.len();
        for p in row.chunks_exact(3) {
            out.extend([p[2], p[1], p[0]]);
        }
        out.resize(start + stride, 0);
    }
    out
}

fn open_line(slot: usize, model: &str) -> String {
    line(&[
        &"open",
        &slot,
        &fixtures().join(model).display(),
        &"cpu",
        &0,
        &0,
        &0,
        &0,
        &0,
    ])
}

/// The Rust API's answer for the case on `model`.
fn rust_video(model: &str, c: &Case) -> EncodedVideo {
    let options = TowerOptions {
        device: Device::Cpu,
        ..TowerOptions::default()
    };
    let m = Model::open_with(&fixtures().join(model), &options, PrepSettings::default()).unwrap();
    let frames: Vec<&[u8]> = c
        .raw
        .chunks_exact(c.width as usize * c.height as usize * 3)
        .collect();
    let video = Video {
        frames: VideoFrames::Rgb {
            width: c.width,
            height: c.height,
            frames: &frames,
        },
        metadata: VideoMetadata {
            total_num_frames: c.n as u64,
            fps: Some(c.fps),
            duration: None,
        },
    };
    let settings = VideoSettings {
        num_frames: (c.num_frames != 0).then_some(c.num_frames),
        ..Default::default()
    };
    m.encode_video(&video, settings).unwrap()
}

/// The script lines of the case on `model` (raw, then BMP frames) and the rows files.
fn case_script(dir: &Path, tag: &str, c: &Case) -> (String, [std::path::PathBuf; 2]) {
    let raw = dir.join(format!("{tag}.rgb"));
    std::fs::write(&raw, &c.raw).unwrap();
    let each = c.width as usize * c.height as usize * 3;
    let frames: Vec<String> = c
        .raw
        .chunks_exact(each)
        .enumerate()
        .map(|(i, f)| {
            let p = dir.join(format!("{tag}-{i:03}.bmp"));
            std::fs::write(&p, bmp(f, c.width, c.height)).unwrap();
            file_arg(&p)
        })
        .collect();
    let outs = [
        dir.join(format!("{tag}-raw.f32")),
        dir.join(format!("{tag}-bmp.f32")),
    ];
    let mut script = line(&[
        &"video",
        &0,
        &outs[0].display(),
        &c.fps,
        &c.num_frames,
        &c.n,
        &c.width,
        &c.height,
        &file_arg(&raw),
    ]);
    let mut enc = vec![
        "video".to_string(),
        "0".into(),
        outs[1].display().to_string(),
        c.fps.to_string(),
        c.num_frames.to_string(),
        c.n.to_string(),
        "0".into(),
        "0".into(),
    ];
    enc.extend(frames);
    script.push_str(&enc.join("\t"));
    script.push('\n');
    (script, outs)
}

/// The checks of one `video` result (its line and piece lines from `at`) against the Rust API;
/// the index of the next line.
fn check_video(
    what: &str,
    lines: &[Line],
    at: usize,
    want: &EncodedVideo,
    rows_file: &Path,
    failures: &mut Vec<String>,
) -> usize {
    let l = &lines[at];
    if l.cmd() != "video" || l.status() != "VT_OK" {
        failures.push(format!("{what}: {:?}", l.0));
        return at + 1;
    }
    let indices = want
        .plan
        .frames_indices
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let grid = want
        .plan
        .grid_thw
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let expect = [
        want.plan.rows.to_string(),
        want.width.to_string(),
        indices,
        grid,
        "VT_OK".into(),
        "1".into(),
        "into-ok".into(),
    ];
    if l.0[3..10] != expect {
        failures.push(format!(
            "{what}: {:?}, the Rust API {expect:?}",
            &l.0[3..10]
        ));
    }
    if bits(&read_f32(rows_file)) != bits(&want.rows) {
        failures.push(format!(
            "{what}: rows differ bitwise from Model::encode_video"
        ));
    }
    let mut i = at + 1;
    for p in &want.plan.prompt {
        let got = lines.get(i).map(|l| l.0.clone()).unwrap_or_default();
        let expect: Vec<String> = match p {
            VideoPiece::Run(r) => vec![
                "piece".into(),
                r.token.id.map_or("-1".to_string(), |id| id.to_string()),
                r.count.to_string(),
                u8::from(r.embeds).to_string(),
                "0".into(),
                r.token.text.clone(),
            ],
            VideoPiece::Text(t) => vec![
                "piece".into(),
                "-1".into(),
                "0".into(),
                "0".into(),
                "1".into(),
                t.clone(),
            ],
        };
        if got != expect {
            failures.push(format!("{what}: piece {got:?}, the Rust API {expect:?}"));
        }
        i += 1;
    }
    i
}

/// The hostile videos: (script line, the status the header documents, a word of the message).
fn hostile(dir: &Path) -> Vec<(String, &'static str, &'static str)> {
    let nothing = dir.join("none.rgb");
    std::fs::write(&nothing, b"").unwrap();
    let scratch_out = dir.join("hostile.f32");
    let out = scratch_out.display().to_string();
    let v = |slot: usize, fps: &str, n: usize, w: u32, h: u32, raw: bool| {
        let mut f = vec![
            "video".to_string(),
            slot.to_string(),
            out.clone(),
            fps.into(),
            "0".into(),
            n.to_string(),
            w.to_string(),
            h.to_string(),
        ];
        if raw {
            f.push(file_arg(&nothing));
        }
        f.join("\t") + "\n"
    };
    vec![
        // 10 000 encoded frames, all empty: a frame read would be "not an image".
        (
            v(0, "30", 10_000, 0, 0, false),
            "VT_ERR_IMAGE_TOO_LARGE",
            "10000 frames",
        ),
        // 4000 raw 500x500 frames (10⁹ pixels), no byte handed in.
        (
            v(0, "2", 4000, 500, 500, true),
            "VT_ERR_IMAGE_TOO_LARGE",
            "video refused",
        ),
        // 64 raw 4000x4000 frames (10⁹ pixels), no rgb pointer at all.
        (
            v(0, "2", 64, 4000, 4000, false),
            "VT_ERR_IMAGE_TOO_LARGE",
            "video refused",
        ),
        // glm5_next needs the video's frame rate.
        (v(0, "0", 4, 0, 0, false), "VT_ERR_IMAGE", "fps"),
        // a family without a video path
        (
            v(1, "2", 2, 0, 0, false),
            "VT_ERR_UNSUPPORTED",
            "no video path",
        ),
    ]
}

#[test]
fn c_program_gets_the_rust_apis_video_plans_and_rows() {
    let dir = scratch("video");
    let cases = [
        ("glm5_next_video/fps1_odd7", "models/glm5_next"),
        ("gemma4_video/g4_n2", "models/gemma4"),
    ];
    let mut failures = Vec::new();
    for (name, model) in cases {
        let c = case(name);
        let want = rust_video(model, &c);
        let tag = name.replace('/', "_");
        let (lines, outs) = case_script(&dir, &tag, &c);
        let script = open_line(0, model) + &lines;
        let run = run_script(&script, Under::Plain, &format!("video-{tag}"));
        let next = check_video(
            &format!("{name} raw"),
            &run.lines,
            1,
            &want,
            &outs[0],
            &mut failures,
        );
        check_video(
            &format!("{name} bmp"),
            &run.lines,
            next,
            &want,
            &outs[1],
            &mut failures,
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn hostile_videos_give_their_documented_status() {
    let dir = scratch("video-hostile");
    let cases = hostile(&dir);
    let mut script = open_line(0, "models/glm5_next") + &open_line(1, "models/step3p7");
    for (l, _, _) in &cases {
        script.push_str(l);
    }
    for under in [Under::Plain, Under::Valgrind] {
        if under == Under::Valgrind
            && !std::process::Command::new("valgrind")
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        {
            continue;
        }
        let run = run_script(&script, under, "video-hostile");
        for ((l, status, word), got) in cases.iter().zip(&run.lines[2..]) {
            assert_eq!(got.status(), *status, "{l:?}: {:?}", got.0);
            assert!(got.message().contains(word), "{l:?}: {:?}", got.0);
            // the plan call refuses it the same way
            assert_eq!(got.field(7), *status, "{l:?}: {:?}", got.0);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `examples/c/video.c` builds against the shared library and prints the Rust API's plan of the
/// glm5_next case from its BMP frames.
#[test]
fn the_c_video_example_builds_and_runs() {
    let lib = lib_dir();
    let dir = scratch("video-example");
    let out = dir.join("video_c");
    let src = crate_dir().join("examples/c/video.c");
    let inc = include_dir();
    let rpath = format!("-Wl,-rpath,{}", lib.display());
    compile(
        &cc(),
        &[
            "-std=c99".as_ref(),
            "-Wall".as_ref(),
            "-Wextra".as_ref(),
            "-Werror".as_ref(),
            "-I".as_ref(),
            inc.as_os_str(),
            src.as_os_str(),
            "-o".as_ref(),
            out.as_os_str(),
            "-L".as_ref(),
            lib.as_os_str(),
            "-lvision_towers_c".as_ref(),
            rpath.as_ref(),
        ],
    );
    let c = case("glm5_next_video/fps1_odd7");
    let want = rust_video("models/glm5_next", &c);
    let each = c.width as usize * c.height as usize * 3;
    let files: Vec<std::path::PathBuf> = c
        .raw
        .chunks_exact(each)
        .enumerate()
        .map(|(i, f)| {
            let p = dir.join(format!("{i:03}.bmp"));
            std::fs::write(&p, bmp(f, c.width, c.height)).unwrap();
            p
        })
        .collect();
    let run = command(&out)
        .arg(fixtures().join("models/glm5_next"))
        .arg(c.fps.to_string())
        .args(&files)
        .output()
        .expect("the example runs");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let head = format!(
        "family glm5_next frames {} sampled {} rows {} width {}",
        c.n,
        want.plan.frames_indices.len(),
        want.plan.rows,
        want.width
    );
    assert!(stdout.contains(&head), "{stdout} lacks {head:?}");
    assert!(stdout.contains("text \"2.0 seconds\""), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}
