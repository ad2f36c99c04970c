//! Video through the C ABI (`vt_model_plan_video`, `vt_model_encode_video`), through the C test
//! program against the Rust API: the upstream video tower cases
//! (`fixtures/outputs/glm5_next_video/fps1_odd7`, `gemma4_video/g4_n2`) from raw RGB frames and
//! from BMP files give rows bitwise `Model::encode_video`'s (library-allocated and, through
//! `vt_model_encode_video_into`, in the caller's buffer) and its plan (sampled frames, grid,
//! every prompt piece); the hostile videos (10 000 frames, 10⁹ pixels, no fps, a family without
//! video) give the documented status, with frames never read; and (valgrind present) the same
//! script under memcheck.
//!
//! In this process (the crate's rlib): `vt_model_encode_video_device` on a CPU model refuses as
//! `vt_model_encode_device` does (`VT_ERR_UNSUPPORTED` before the buffer is sized), and the size
//! check it shares with `vt_model_encode_video_into` answers from the frames' headers before any
//! frame is decoded. Its rows on CUDA: `tests/gpu.rs`.

mod common;

use common::*;
use std::ffi::{c_void, CStr, CString};
use std::path::Path;
use vision_towers::vision_prep::{PrepSettings, Video, VideoFrames, VideoPiece};
use vision_towers::{Device, EncodedVideo, Model, TowerOptions};
use vision_towers_c::*;

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
fn rust_video(model: &str, c: &VideoCase) -> EncodedVideo {
    let options = TowerOptions {
        device: Device::Cpu,
        ..TowerOptions::default()
    };
    let m = Model::open_with(&fixtures().join(model), &options, PrepSettings::default()).unwrap();
    let frames = c.frames();
    let video = Video {
        frames: VideoFrames::Rgb {
            width: c.width,
            height: c.height,
            frames: &frames,
        },
        metadata: c.metadata(),
    };
    m.encode_video(&video, c.settings()).unwrap()
}

/// The script lines of the case on `model` (raw, then BMP frames) and the rows files.
fn case_script(dir: &Path, tag: &str, c: &VideoCase) -> (String, [std::path::PathBuf; 2]) {
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
        let c = video_case(name);
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
    let c = video_case("glm5_next_video/fps1_odd7");
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

// ---------------------------------------------------------------------------------------------
// In this process (the crate's rlib): the device call on the CPU, and the size check it shares
// ---------------------------------------------------------------------------------------------

fn last_error() -> String {
    // SAFETY: vt_last_error returns a NUL-terminated string valid until the next call here.
    unsafe { CStr::from_ptr(vt_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// A model opened through the C ABI on the CPU.
struct CpuHandle(*mut vt_model);

impl CpuHandle {
    fn open(model: &str) -> CpuHandle {
        let path = CString::new(fixtures().join(model).to_str().unwrap()).unwrap();
        let mut o = vt_open_options_default();
        o.device = c"cpu".as_ptr();
        let mut m = std::ptr::null_mut();
        // SAFETY: a NUL-terminated path, valid options and out-param.
        let s = unsafe { vt_model_open(path.as_ptr(), &o, &mut m) };
        assert_eq!(s, vt_status::VT_OK, "{model}: {}", last_error());
        CpuHandle(m)
    }

    /// The elements `video`'s rows take, from `vt_model_plan_video`.
    fn elements(&self, video: &vt_video, settings: &vt_video_settings) -> usize {
        let mut p = std::ptr::null_mut();
        // SAFETY: a live handle, a video whose pointers hold what it says, a valid out-param.
        let s = unsafe { vt_model_plan_video(self.0, video, settings, &mut p) };
        assert_eq!(s, vt_status::VT_OK, "{}", last_error());
        // SAFETY: a plan from vt_model_plan_video, freed once; a live handle.
        unsafe {
            let n = vt_video_plan_rows(p) as usize * vt_model_width(self.0);
            vt_video_plan_free(p);
            n
        }
    }
}

impl Drop for CpuHandle {
    fn drop(&mut self) {
        // SAFETY: a handle from vt_model_open, freed once.
        unsafe { vt_model_free(self.0) };
    }
}

/// `vt_model_encode_video_device` on a CPU model is `VT_ERR_UNSUPPORTED` whatever `dst` is, as
/// `vt_model_encode_device` answers for an image on the same handle: the device checks come
/// first, so a short (or NULL, or misaligned) `dst` is refused as unsupported, with `*needed` and
/// `*plan` untouched (no size would do); an unknown dtype is `VT_ERR_INVALID_ARGUMENT` and a NULL
/// model `VT_ERR_NULL_ARGUMENT`, as there.
#[test]
fn video_device_rows_from_a_cpu_model_are_unsupported_before_the_buffer_is_sized() {
    let c = video_case("glm5_next_video/fps1_odd7");
    let h = CpuHandle::open("models/glm5_next");
    let (video, settings) = (c.vt_video(), c.vt_settings());
    let n = h.elements(&video, &settings);
    let tiny = std::fs::read(fixtures().join("images/tiny_20x15.png")).unwrap();
    let image = vt_image {
        data: tiny.as_ptr(),
        len: tiny.len(),
        kind: vt_image_kind::VT_IMAGE_BYTES as u32,
    };
    let mut host = vec![0f32; n + 1];
    let base = host.as_mut_ptr().cast::<c_void>();
    let misaligned = base.cast::<u8>().wrapping_add(1).cast::<c_void>();
    let null = std::ptr::null_mut::<c_void>();
    let cpu = "need a model opened on CUDA";
    let cases = [
        (
            "room for the rows",
            base,
            n,
            0,
            vt_status::VT_ERR_UNSUPPORTED,
            cpu,
        ),
        (
            "one element short",
            base,
            n - 1,
            0,
            vt_status::VT_ERR_UNSUPPORTED,
            cpu,
        ),
        ("no room", base, 0, 0, vt_status::VT_ERR_UNSUPPORTED, cpu),
        ("NULL dst", null, n, 0, vt_status::VT_ERR_UNSUPPORTED, cpu),
        (
            "misaligned dst",
            misaligned,
            n,
            0,
            vt_status::VT_ERR_UNSUPPORTED,
            cpu,
        ),
        ("bf16 rows", base, n, 1, vt_status::VT_ERR_UNSUPPORTED, cpu),
        (
            "dtype 9",
            base,
            n,
            9,
            vt_status::VT_ERR_INVALID_ARGUMENT,
            "not a vt_dtype",
        ),
    ];
    for (what, dst, dst_len, dtype, status, word) in cases {
        let mut needed = usize::MAX;
        let mut plan = std::ptr::null_mut();
        // SAFETY: a live handle, the case's video; `dst` is never dereferenced on a CPU model
        // (the call refuses before it); valid out-params.
        let s = unsafe {
            vt_model_encode_video_device(
                h.0,
                &video,
                &settings,
                dst,
                dst_len,
                dtype,
                std::ptr::null_mut(),
                &mut needed,
                &mut plan,
            )
        };
        let message = last_error();
        assert_eq!(s, status, "{what}: {message}");
        assert!(message.contains(word), "{what}: {message:?} lacks {word:?}");
        assert_eq!(needed, usize::MAX, "{what}: *needed written on a refusal");
        assert!(plan.is_null(), "{what}: *plan written on a refusal");
        // The image call answers the same on the same handle and arguments.
        let mut offsets = [usize::MAX; 2];
        let mut image_needed = usize::MAX;
        // SAFETY: as above, one live image.
        let image_status = unsafe {
            vt_model_encode_device(
                h.0,
                &image,
                1,
                dst,
                dst_len,
                dtype,
                std::ptr::null_mut(),
                offsets.as_mut_ptr(),
                &mut image_needed,
            )
        };
        assert_eq!(image_status, s, "{what}: vt_model_encode_device differs");
        assert_eq!(image_needed, usize::MAX, "{what}");
    }
    let mut needed = usize::MAX;
    // SAFETY: a NULL model is refused before anything is read.
    let s = unsafe {
        vt_model_encode_video_device(
            std::ptr::null(),
            &video,
            &settings,
            base,
            n,
            0,
            std::ptr::null_mut(),
            &mut needed,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(s, vt_status::VT_ERR_NULL_ARGUMENT, "{}", last_error());
    assert!(last_error().contains("model"), "{}", last_error());
    assert_eq!(needed, usize::MAX);
    assert!(host.iter().all(|v| *v == 0.0), "the buffer was written");
    // The handle still works after the refusals.
    assert_eq!(h.elements(&video, &settings), n);
}

/// The size check `vt_model_encode_video_device` shares with `vt_model_encode_video_into`
/// answers from the video's plan alone: with every frame a BMP header and no pixels (any frame
/// decoded is refused), a buffer one element short is `VT_ERR_BUFFER_TOO_SMALL` with `*needed`
/// the elements the raw frames' plan takes, and nothing written, while a buffer large enough
/// gets to the decode, which refuses a sampled frame (`VT_ERR_IMAGE`, the frame named).
#[test]
fn a_short_buffer_is_refused_from_the_frames_headers_before_any_frame_is_decoded() {
    let cases = [
        ("glm5_next_video/fps1_odd7", "models/glm5_next"),
        ("gemma4_video/g4_n2", "models/gemma4"),
    ];
    for (name, model) in cases {
        let c = video_case(name);
        let h = CpuHandle::open(model);
        let settings = c.vt_settings();
        let n = h.elements(&c.vt_video(), &settings);
        let bmps = header_only_bmps(&c);
        let frames: Vec<vt_image> = bmps
            .iter()
            .map(|b| vt_image {
                data: b.as_ptr(),
                len: b.len(),
                kind: vt_image_kind::VT_IMAGE_BYTES as u32,
            })
            .collect();
        let video = vt_video {
            frames: frames.as_ptr(),
            rgb: std::ptr::null(),
            rgb_len: 0,
            width: 0,
            height: 0,
            ..c.vt_video()
        };
        assert_eq!(h.elements(&video, &settings), n, "{name}: headers' plan");
        let poison = f32::from_bits(u32::MAX);
        let mut out = vec![poison; n];
        for (len, status) in [
            (n - 1, vt_status::VT_ERR_BUFFER_TOO_SMALL),
            (n, vt_status::VT_ERR_IMAGE),
        ] {
            let mut needed = usize::MAX;
            let mut plan = std::ptr::null_mut();
            // SAFETY: a live handle, frames alive for the call, `out` holds n >= len floats.
            let s = unsafe {
                vt_model_encode_video_into(
                    h.0,
                    &video,
                    &settings,
                    out.as_mut_ptr(),
                    len,
                    &mut needed,
                    &mut plan,
                )
            };
            let message = last_error();
            assert_eq!(s, status, "{name} into {len}: {message}");
            assert!(plan.is_null(), "{name}: *plan written on a refusal");
            if status == vt_status::VT_ERR_BUFFER_TOO_SMALL {
                assert_eq!(needed, n, "{name}: *needed");
                assert_eq!(vt_last_error_image(), -1, "{name}");
            } else {
                assert_eq!(needed, usize::MAX, "{name}: *needed written on {s:?}");
                let frame = vt_last_error_image();
                assert!(
                    (0..c.n as i64).contains(&frame),
                    "{name}: the refused frame {frame}: {message}"
                );
            }
            assert!(
                out.iter().all(|v| v.to_bits() == u32::MAX),
                "{name}: the buffer was written"
            );
        }
    }
}
