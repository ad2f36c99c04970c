//! The C ABI against the Rust API, through a C program (`tests/c/vt_ctest.c`) compiled with the
//! system compiler against `include/vision_towers.h` and linked against `libvision_towers_c.so`:
//!
//! - every fixture model: plans (rows, runs, placeholder mask, sizes, grid) equal `Model::plan`'s
//!   and rows bitwise `Model::encode`'s, through the library's rows and the caller's buffer
//!   (too small: the status, `*needed`, nothing else written); the HF processor's tensors equal
//!   `Model::encode_tensors`; one `const vt_model*` encoding from several threads;
//! - NULL and bad arguments to every function, and a panic caught at the boundary;
//! - every case of the adversarial corpus (`fixtures/adversarial/manifest.json`): the status the
//!   header documents for the Rust error's class (and one the manifest allows), with the Rust
//!   error's message;
//! - valgrind memcheck over a run of all of the above on a subset (no error, no definite or
//!   indirect leak);
//! - `examples/c` (shared library) and `examples/cpp` (static library) build and run.

mod common;

use common::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;
use vision_towers::vision_prep::{ImageSource, PrepSettings};
use vision_towers::{Device, Model, ModelError, PrepOpenError, TowerError, TowerOptions};

// ---------------------------------------------------------------------------------------------
// Parity with the Rust API on the fixture models
// ---------------------------------------------------------------------------------------------

/// (model, gemma4 `max_soft_tokens` or 0): every fixture layout; the GGUF mmproj carries no
/// processor config, so it runs at 70 soft tokens as the HF fixture's config says.
const MODELS: [(&str, u32); 8] = [
    ("models/gemma4", 0),
    ("models/gemma4_clipped", 0),
    ("models/gemma4_gguf/mmproj-BF16.gguf", 70),
    ("models/glm5_next", 0),
    ("models/glm_ocr", 0),
    ("models/step3p7", 0),
    ("models/step3p7_hf", 0),
    ("models/step3p7_sharded", 0),
];

const IMAGES: [&str; 3] = [
    "coffee_144x96.jpg",
    "tiny_20x15.png",
    "logo_rgba_112x84.png",
];

/// The placeholder token texts of the fixtures' processors (upstream: gemma4's and glm's
/// `<|image|>`, step3p7's `<im_patch>`).
const PLACEHOLDERS: [&str; 2] = ["<|image|>", "<im_patch>"];

fn settings(max_soft_tokens: u32) -> PrepSettings {
    PrepSettings {
        max_soft_tokens: (max_soft_tokens != 0).then_some(max_soft_tokens),
        ..PrepSettings::default()
    }
}

fn open_cpu(model: &str, max_soft_tokens: u32) -> Model {
    let options = TowerOptions {
        device: Device::Cpu,
        ..TowerOptions::default()
    };
    Model::open_with(&fixtures().join(model), &options, settings(max_soft_tokens))
        .unwrap_or_else(|e| panic!("{model}: {e}"))
}

/// A check against the Rust API on one model: the script lines and how to read their results.
struct Parity {
    script: String,
    checks: Vec<Check>,
}

/// What one result line (in order) must say.
enum Check {
    Open {
        model: String,
        family: String,
        width: usize,
    },
    Plan {
        what: String,
        plan: vision_towers::vision_prep::Plan,
    },
    Encode {
        what: String,
        file: PathBuf,
        rows: Vec<f32>,
        offsets: Vec<usize>,
    },
    TooSmall {
        what: String,
        needed: usize,
    },
    Threads,
    Ok(&'static str),
}

fn offsets_text(o: &[usize]) -> String {
    o.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// What [`parity`] runs after the plans.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Encodes {
    /// Plans only.
    None,
    /// The library's rows, the caller's buffer, one element short.
    All,
    /// All of those, and one `const vt_model*` encoding from several threads.
    AllAndThreads,
}

/// Plans and the encodes `encode` names for `images` on `model`; the Rust API's answers are
/// computed here.
fn parity(
    slot: usize,
    model: &str,
    max_soft_tokens: u32,
    images: &[&str],
    encode: Encodes,
) -> Parity {
    let m = open_cpu(model, max_soft_tokens);
    let dir = scratch("parity");
    let tag = model.replace('/', "_");
    let mut script = line(&[
        &"open",
        &slot,
        &fixtures().join(model).display(),
        &"cpu",
        &0,
        &max_soft_tokens,
        &0,
        &0,
        &0,
    ]);
    let mut checks = vec![Check::Open {
        model: model.into(),
        family: m.family().name().into(),
        width: m.width(),
    }];
    let paths: Vec<PathBuf> = images
        .iter()
        .map(|i| fixtures().join("images").join(i))
        .collect();
    let bytes: Vec<Vec<u8>> = paths.iter().map(|p| std::fs::read(p).unwrap()).collect();
    let sources: Vec<ImageSource<'_>> = bytes.iter().map(|b| ImageSource::Bytes(b)).collect();
    for (p, s) in paths.iter().zip(&sources) {
        script.push_str(&line(&[&"plan", &slot, &file_arg(p)]));
        checks.push(Check::Plan {
            what: format!("{model} {}", p.display()),
            plan: m.plan(*s).unwrap(),
        });
    }
    if encode == Encodes::None {
        script.push_str(&line(&[&"free", &slot]));
        checks.push(Check::Ok("free"));
        return Parity { script, checks };
    }
    let encoded = m.encode(&sources).unwrap();
    let rows: Vec<f32> = encoded.iter().flat_map(|e| e.rows.clone()).collect();
    let mut offsets = vec![0];
    for e in &encoded {
        offsets.push(offsets.last().unwrap() + e.plan.rows as usize);
    }
    let args: Vec<String> = paths.iter().map(|p| file_arg(p)).collect();
    let out = dir.join(format!("{tag}-rows.f32"));
    let mut cmd = vec![
        "encode".to_string(),
        slot.to_string(),
        out.display().to_string(),
    ];
    cmd.extend(args.clone());
    script.push_str(&(cmd.join("\t") + "\n"));
    checks.push(Check::Encode {
        what: format!("{model} vt_model_encode"),
        file: out,
        rows: rows.clone(),
        offsets: offsets.clone(),
    });
    let into = dir.join(format!("{tag}-into.f32"));
    let mut cmd = vec![
        "encode_into".to_string(),
        slot.to_string(),
        rows.len().to_string(),
        into.display().to_string(),
    ];
    cmd.extend(args.clone());
    script.push_str(&(cmd.join("\t") + "\n"));
    checks.push(Check::Encode {
        what: format!("{model} vt_model_encode_into"),
        file: into,
        rows: rows.clone(),
        offsets,
    });
    let mut cmd = vec![
        "encode_into".to_string(),
        slot.to_string(),
        (rows.len() - 1).to_string(),
        "/dev/null".to_string(),
    ];
    cmd.extend(args);
    script.push_str(&(cmd.join("\t") + "\n"));
    checks.push(Check::TooSmall {
        what: format!("{model} vt_model_encode_into one short"),
        needed: rows.len(),
    });
    if encode == Encodes::AllAndThreads {
        script.push_str(&line(&[&"threads", &slot, &3, &file_arg(&paths[0])]));
        checks.push(Check::Threads);
    }
    script.push_str(&line(&[&"free", &slot]));
    checks.push(Check::Ok("free"));
    Parity { script, checks }
}

/// The HF processor's tensors of a tower fixture through `vt_model_encode_tensors`, against
/// `Model::encode_tensors`.
fn tensor_parity(slot: usize, model: &str, case: &str) -> Parity {
    let m = open_cpu(model, 0);
    let file = fixtures()
        .join("outputs")
        .join(format!("{case}.safetensors"));
    // The processor's tensors; the activations are stored under `f32/…` and `f64/…`.
    let list = tensors_of_file(&file, |n| !n.contains('/')).unwrap();
    let rows = m
        .encode_tensors(&processor_tensors(&list).unwrap())
        .unwrap();
    let dir = scratch("tensors");
    let tag = case.replace('/', "_");
    let mut script = line(&[
        &"open",
        &slot,
        &fixtures().join(model).display(),
        &"cpu",
        &0,
        &0,
        &0,
        &0,
        &0,
    ]);
    let mut checks = vec![Check::Open {
        model: model.into(),
        family: m.family().name().into(),
        width: m.width(),
    }];
    script.push_str(&tensor_script(&list, &dir, &tag));
    checks.push(Check::Ok("tensors_new"));
    for (_, _, v) in &list {
        checks.push(Check::Ok(match v {
            TensorValues::F32(_) => "tensor_f32",
            TensorValues::I64(_) => "tensor_i64",
        }));
    }
    let out = dir.join(format!("{tag}.f32"));
    script.push_str(&line(&[&"encode_tensors", &slot, &out.display()]));
    let mut offsets = vec![0];
    for r in &rows.per_image {
        offsets.push(offsets.last().unwrap() + r.len() / rows.width);
    }
    checks.push(Check::Encode {
        what: format!("{model} {case} vt_model_encode_tensors"),
        file: out,
        rows: rows.per_image.concat(),
        offsets,
    });
    script.push_str(&line(&[&"free", &slot]));
    checks.push(Check::Ok("free"));
    Parity { script, checks }
}

/// (model, a tower fixture holding the upstream processor's tensors).
const TENSOR_CASES: [(&str, &str); 4] = [
    ("models/gemma4", "gemma4/batch2"),
    ("models/glm5_next", "glm5_next/batch2"),
    ("models/glm_ocr", "glm_ocr/batch2"),
    ("models/step3p7", "step3p7/batch2"),
];

/// Checks `lines` (the script's results, `run` lines set apart) against `checks`; returns the
/// failures.
fn verify(checks: &[Check], lines: &[Line]) -> Vec<String> {
    let mut failures = Vec::new();
    let mut it = lines.iter().peekable();
    for check in checks {
        let Some(l) = it.next() else {
            failures.push("the C program stopped early".into());
            break;
        };
        let mut runs = Vec::new();
        while it.peek().is_some_and(|n| n.cmd() == "run") {
            runs.push(it.next().unwrap().clone());
        }
        let mut fail = |what: &str, msg: String| failures.push(format!("{what}: {msg}"));
        match check {
            Check::Open {
                model,
                family,
                width,
            } => {
                if l.cmd() != "open" || l.status() != "VT_OK" {
                    fail(model, format!("open gave {:?}", l.0));
                } else if l.field(2) != family || l.field(3) != width.to_string() {
                    fail(
                        model,
                        format!("family/width {:?}, Rust {family} {width}", l.0),
                    );
                } else if l.field(5) != "-1" || l.field(6) != "1" {
                    fail(
                        model,
                        format!("device/precision {:?}, expected cpu f32", l.0),
                    );
                }
            }
            Check::Plan { what, plan } => {
                if l.status() != "VT_OK" {
                    fail(what, format!("plan gave {:?}", l.0));
                    continue;
                }
                let grid = plan
                    .grid()
                    .iter()
                    .map(|g| g.to_string())
                    .collect::<Vec<_>>()
                    .join(",");
                let want = [
                    plan.rows.to_string(),
                    plan.prompt_len().to_string(),
                    format!("{}x{}", plan.width, plan.height),
                    format!("{}x{}", plan.target.0, plan.target.1),
                    grid,
                ];
                let got: Vec<&str> = (3..8).map(|i| l.field(i)).collect();
                if got != want {
                    fail(what, format!("plan {got:?}, Rust {want:?}"));
                }
                if runs.len() != plan.prompt_runs.len() {
                    fail(
                        what,
                        format!("{} runs, Rust {}", runs.len(), plan.prompt_runs.len()),
                    );
                    continue;
                }
                let mut placeholders = 0u64;
                for (r, p) in runs.iter().zip(&plan.prompt_runs) {
                    let id = p.token.id.map_or(-1, i64::from).to_string();
                    let embed = PLACEHOLDERS.contains(&p.token.text.as_str());
                    if embed {
                        placeholders += p.count;
                    }
                    let want = [
                        id.as_str(),
                        &p.count.to_string(),
                        if embed { "1" } else { "0" },
                        &p.token.text,
                    ];
                    let got = [r.field(1), r.field(2), r.field(3), r.field(4)];
                    if got != want {
                        fail(what, format!("run {got:?}, Rust {want:?}"));
                    }
                }
                if placeholders != plan.rows {
                    fail(
                        what,
                        format!("{placeholders} placeholders, {} rows", plan.rows),
                    );
                }
            }
            Check::Encode {
                what,
                file,
                rows,
                offsets,
            } => {
                if l.status() != "VT_OK" {
                    fail(what, format!("gave {:?}", l.0));
                    continue;
                }
                let o = match l.cmd() {
                    "encode" => l.field(5),
                    "encode_into" => l.field(4),
                    _ => l.field(4),
                };
                if o != offsets_text(offsets) {
                    fail(what, format!("offsets {o}, Rust {}", offsets_text(offsets)));
                }
                let got = read_f32(file);
                if bits(&got) != bits(rows) {
                    fail(
                        what,
                        format!(
                            "rows differ from the Rust API's ({} vs {} values)",
                            got.len(),
                            rows.len()
                        ),
                    );
                }
            }
            Check::TooSmall { what, needed } => {
                let want = [
                    "VT_ERR_BUFFER_TOO_SMALL".to_string(),
                    "-1".into(),
                    needed.to_string(),
                    "untouched".into(),
                ];
                let got: Vec<&str> = (1..5).map(|i| l.field(i)).collect();
                if got != want || !l.message().contains(&needed.to_string()) {
                    fail(what, format!("gave {:?}, expected {want:?}", l.0));
                }
            }
            Check::Threads => {
                if l.0[1..3] != ["VT_OK", "same"] {
                    fail("threads", format!("gave {:?}", l.0));
                }
            }
            Check::Ok(cmd) => {
                // (the version line carries the version where others carry the status)
                if l.cmd() != *cmd || (l.status() != "VT_OK" && *cmd != "version") {
                    fail(cmd, format!("gave {:?}", l.0));
                }
            }
        }
    }
    if let Some(extra) = it.next() {
        failures.push(format!("unexpected output {:?}", extra.0));
    }
    failures
}

#[test]
fn c_program_gets_the_rust_apis_plans_and_rows_on_every_fixture_model() {
    let start = Instant::now();
    let mut script = line(&[&"version"]);
    let mut checks = vec![Check::Ok("version")];
    for (i, (model, mst)) in MODELS.iter().enumerate() {
        let encodes = if i == 0 {
            Encodes::AllAndThreads
        } else {
            Encodes::All
        };
        let p = parity(0, model, *mst, &IMAGES, encodes);
        script.push_str(&p.script);
        checks.extend(p.checks);
    }
    for (model, case) in TENSOR_CASES {
        let p = tensor_parity(1, model, case);
        script.push_str(&p.script);
        checks.extend(p.checks);
    }
    let rust_s = start.elapsed().as_secs_f64();
    let run = run_script(&script, Under::Plain, "parity");
    let version = &run.lines[0];
    assert_eq!(
        version.0[1..],
        [env!("CARGO_PKG_VERSION"), "1", "1"],
        "vt_version / vt_abi_version / VT_ABI_VERSION"
    );
    let failures = verify(&checks, &run.lines);
    eprintln!(
        "parity: {} models × {} images + {} tensor cases; Rust side {rust_s:.1} s, C program \
         {:.1} s",
        MODELS.len(),
        IMAGES.len(),
        TENSOR_CASES.len(),
        run.seconds
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn null_and_bad_arguments_and_a_caught_panic() {
    let tiny = fixtures().join("images/tiny_20x15.png");
    let mut script = line(&[
        &"open",
        &0,
        &fixtures().join("models/gemma4").display(),
        &"cpu",
        &0,
        &0,
        &0,
        &0,
        &0,
    ]);
    script.push_str(&line(&[
        &"nulls",
        &0,
        &file_arg(&tiny),
        &fixtures().join("models/gemma4").display(),
    ]));
    script.push_str(&line(&[&"panic"]));
    let run = run_script(&script, Under::Plain, "nulls");
    let nulls = &run.lines[1];
    assert_eq!(
        nulls.0,
        ["nulls", "ok"],
        "checks that failed: {:?}",
        nulls.0
    );
    let panic = &run.lines[2];
    assert_eq!(panic.status(), "VT_ERR_PANIC", "{:?}", panic.0);
    assert!(
        panic.message().contains("a deliberate panic") && panic.message().contains("bug"),
        "{:?}",
        panic.0
    );
}

// ---------------------------------------------------------------------------------------------
// The adversarial corpus
// ---------------------------------------------------------------------------------------------

fn corpus() -> PathBuf {
    fixtures().join("adversarial")
}

/// The families every image case is planned with (slots 0–3 of the script), as in
/// `crates/vision-towers/tests/adversarial.rs`.
const FAMILIES: [&str; 4] = ["gemma4", "glm5_next", "glm_ocr", "step3p7"];

/// The slot model cases are opened in.
const CASE_SLOT: usize = 4;

/// The variant name of an error enum, from its `Debug` form.
fn variant(e: &dyn std::fmt::Debug) -> String {
    let s = format!("{e:?}");
    s.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .next()
        .unwrap_or_default()
        .to_string()
}

/// The manifest's class of a Rust error (as `crates/vision-towers/tests/adversarial.rs` names
/// them).
fn class_model(e: &ModelError) -> String {
    fn tower(e: &TowerError) -> String {
        use vision_towers::Error as E;
        match e {
            TowerError::Open(E::Gguf { source, .. }) => format!("gguf:{}", variant(source)),
            TowerError::Open(E::SafeTensors { source, .. }) => {
                format!("safetensors:{}", variant(source))
            }
            TowerError::Open(E::Io { .. }) => "io".into(),
            TowerError::Open(E::GgufDirectory { .. }) => "format:GgufDirectory".into(),
            TowerError::Open(E::UnknownFormat { .. }) => "format:UnknownFormat".into(),
            TowerError::UnknownFamily { .. } => "family:UnknownFamily".into(),
            TowerError::NotImplemented { .. } => "family:NotImplemented".into(),
            TowerError::Unsupported(_) => "unsupported".into(),
            TowerError::Refused { source, .. } => format!("tower:{}", variant(source)),
            TowerError::Inputs { .. } => "inputs".into(),
            TowerError::Pass { source, .. } => tower(source),
            other => format!("facade:{}", variant(other)),
        }
    }
    match e {
        ModelError::Tower(t) | ModelError::ImageRefused(t) => tower(t),
        ModelError::Prep(PrepOpenError::Prep { source, .. }) => format!("prep:{}", variant(source)),
        ModelError::Prep(PrepOpenError::Tokenizer(e)) => format!("safetensors:{}", variant(e)),
        ModelError::Prep(PrepOpenError::Io { .. }) => "io".into(),
        ModelError::Prep(PrepOpenError::TooLarge { .. }) => "io:TooLarge".into(),
        ModelError::Image { source, .. } => format!("prep:{}", variant(source)),
        ModelError::RowsOffPlan { .. } => "bug:RowsOffPlan".into(),
    }
}

/// Where an operation runs, for the status a class maps to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    /// `vt_model_plan` / `vt_model_encode` of image bytes or a URI.
    Image,
    /// `vt_model_open` (and the plan and encode after it) of a malformed model.
    Model,
    /// `vt_model_encode_tensors` of prepared inputs.
    Inputs,
}

/// The statuses the header documents for a manifest class (`ns:*` patterns included).
fn statuses(class: &str, op: Op) -> Vec<&'static str> {
    const TOO_LARGE: [&str; 3] = ["OverBudget", "DataUriTooLarge", "OutputTooLarge"];
    let (ns, name) = class.split_once(':').unwrap_or((class, ""));
    match (ns, op) {
        ("ok", _) => vec!["VT_OK"],
        ("io", _) => vec!["VT_ERR_IO"],
        ("prep", Op::Image) if name == "*" => vec!["VT_ERR_IMAGE", "VT_ERR_IMAGE_TOO_LARGE"],
        ("prep", Op::Image) if TOO_LARGE.contains(&name) => vec!["VT_ERR_IMAGE_TOO_LARGE"],
        ("prep", Op::Image) => vec!["VT_ERR_IMAGE"],
        // the tower refused an image its own processor prepared (a grid past a tiny model's
        // position table): the image's
        ("tower", Op::Image) => vec!["VT_ERR_IMAGE"],
        ("prep" | "gguf" | "safetensors" | "tower" | "family" | "format", Op::Model) => {
            vec!["VT_ERR_MODEL"]
        }
        ("inputs" | "tower", Op::Inputs) => vec!["VT_ERR_INPUT"],
        _ => vec![],
    }
}

/// A Rust outcome: `ok`, or the class and message of the error.
#[derive(Debug, Clone)]
struct Outcome {
    class: String,
    message: String,
}

impl Outcome {
    fn of<T>(r: &Result<T, ModelError>) -> Outcome {
        match r {
            Ok(_) => Outcome {
                class: "ok".into(),
                message: String::new(),
            },
            Err(e) => Outcome {
                class: class_model(e),
                message: e.to_string(),
            },
        }
    }
}

/// One C result line the corpus expects, in script order.
struct Expect {
    id: String,
    label: String,
    cmd: &'static str,
    op: Op,
    /// The manifest's classes for this operation.
    allowed: Vec<String>,
    /// What the Rust API gave for the same call.
    rust: Outcome,
}

/// An image case's input: bytes, or a URI (written to a file for the script).
enum ImageInput {
    Bytes(Vec<u8>),
    Uri(String),
}

fn strs(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

fn image_input(src: &Value) -> ImageInput {
    if let Some(f) = src["file"].as_str() {
        return ImageInput::Bytes(std::fs::read(corpus().join(f)).expect("corpus file"));
    }
    if let Some(d) = src.get("derive") {
        let mut b = std::fs::read(fixtures().join(d["base"].as_str().expect("base")))
            .expect("fixture image");
        if let Some(n) = d["truncate"].as_u64() {
            b.truncate(n as usize);
        }
        if let Some(f) = d["flip"].as_array() {
            let (pos, bit) = (f[0].as_u64().unwrap() as usize, f[1].as_u64().unwrap());
            b[pos] ^= 1 << bit;
        }
        return ImageInput::Bytes(b);
    }
    if let Some(u) = src["uri"].as_str() {
        return ImageInput::Uri(u.to_string());
    }
    let g = &src["uri_gen"];
    let prefix = g["prefix"].as_str().expect("prefix");
    let fill = g["fill"].as_str().expect("fill");
    let len = g["len"].as_u64().expect("len") as usize;
    let mut s = prefix.to_string();
    s.push_str(&fill.repeat((len - prefix.len()).div_ceil(fill.len())));
    ImageInput::Uri(s)
}

/// Copies a case's base model into `dir` and applies its edits (as the library test does);
/// returns the path to open.
fn materialize_model(model: &Value, dir: &Path) -> PathBuf {
    let base = fixtures().join(model["base"].as_str().expect("base"));
    std::fs::create_dir_all(dir).expect("case dir");
    let edits: Vec<&Value> = model["edits"].as_array().into_iter().flatten().collect();
    let edited = |name: &std::ffi::OsStr| {
        edits.iter().any(|e| {
            e["file"]
                .as_str()
                .map_or(!base.is_dir(), |f| std::ffi::OsStr::new(f) == name)
        })
    };
    let place = |from: &Path, to: &Path| {
        if edited(to.file_name().expect("file name")) {
            std::fs::copy(from, to).map(drop)
        } else {
            std::os::unix::fs::symlink(from, to)
        }
        .expect("place fixture file");
    };
    let target = if base.is_dir() {
        for e in std::fs::read_dir(&base).expect("base dir") {
            let e = e.expect("entry");
            place(&e.path(), &dir.join(e.file_name()));
        }
        dir.to_path_buf()
    } else {
        let t = dir.join(base.file_name().expect("file name"));
        place(&base, &t);
        t
    };
    for edit in edits {
        let file = match edit["file"].as_str() {
            Some(f) => dir.join(f),
            None => target.clone(),
        };
        match edit["op"].as_str().expect("op") {
            "patch" => {
                let mut b = std::fs::read(&file).expect("read");
                let at = edit["at"].as_u64().expect("at") as usize;
                let bytes = hex(edit["hex"].as_str().expect("hex"));
                b[at..at + bytes.len()].copy_from_slice(&bytes);
                std::fs::write(&file, b).expect("write");
            }
            "truncate" => {
                let mut b = std::fs::read(&file).expect("read");
                b.truncate(edit["len"].as_u64().expect("len") as usize);
                std::fs::write(&file, b).expect("write");
            }
            "splice_head" => {
                let b = std::fs::read(&file).expect("read");
                let mut out = std::fs::read(corpus().join(edit["head"].as_str().expect("head")))
                    .expect("head");
                out.extend_from_slice(
                    &b[edit["keep_from"].as_u64().expect("keep_from") as usize..],
                );
                std::fs::write(&file, out).expect("write");
            }
            "replace" => {
                let _ = std::fs::remove_file(&file);
                std::fs::copy(corpus().join(edit["with"].as_str().expect("with")), &file)
                    .expect("replace");
            }
            "delete" => std::fs::remove_file(&file).expect("delete"),
            other => panic!("unknown edit op {other}"),
        }
    }
    target
}

/// The corpus (the cases `keep` selects) as one script, with what each result line must say.
struct Corpus {
    script: String,
    expects: Vec<Expect>,
    /// Cases per class.
    classes: BTreeMap<String, usize>,
    /// Inputs cases whose file the safetensors reader refuses (nothing reaches the C ABI).
    unreadable_inputs: usize,
}

fn build_corpus(keep: impl Fn(usize, &Value) -> bool, models: &[Model], dir: &Path) -> Corpus {
    let text = std::fs::read_to_string(corpus().join("manifest.json")).expect("manifest.json");
    let manifest: Value = serde_json::from_str(&text).expect("manifest is JSON");
    let cases = manifest["cases"].as_array().expect("cases");
    let mut c = Corpus {
        script: String::new(),
        expects: Vec::new(),
        classes: BTreeMap::new(),
        unreadable_inputs: 0,
    };
    for (i, f) in FAMILIES.iter().enumerate() {
        c.script.push_str(&line(&[
            &"open",
            &i,
            &fixtures().join("models").join(f).display(),
            &"cpu",
            &0,
            &0,
            &0,
            &0,
            &0,
        ]));
        c.expects.push(Expect {
            id: format!("fixture {f}"),
            label: "open".into(),
            cmd: "open",
            op: Op::Model,
            allowed: vec!["ok".into()],
            rust: Outcome {
                class: "ok".into(),
                message: String::new(),
            },
        });
    }
    let tiny_path = fixtures().join("images/tiny_20x15.png");
    let tiny = std::fs::read(&tiny_path).expect("tiny image");
    for (index, case) in cases.iter().enumerate() {
        if !keep(index, case) || case.get("known_failing").is_some() {
            continue;
        }
        let id = case["id"].as_str().expect("id").to_string();
        *c.classes
            .entry(case["class"].as_str().expect("class").into())
            .or_default() += 1;
        let expect = |op: &str| strs(&case["expect"][op]);
        if let Some(src) = case.get("source") {
            let input = image_input(src);
            let path = dir.join(format!("c{index}"));
            let (arg, source_bytes) = match &input {
                ImageInput::Bytes(b) => {
                    std::fs::write(&path, b).expect("image file");
                    (format!("file:{}", path.display()), Some(b.as_slice()))
                }
                ImageInput::Uri(u) => {
                    std::fs::write(&path, u).expect("uri file");
                    (format!("uri:{}", path.display()), None)
                }
            };
            // The Rust reference for one call: the URI parsed as the C ABI does.
            let call = |m: &Model, op: &str| -> Outcome {
                let src = match (&input, source_bytes) {
                    (_, Some(b)) => ImageSource::Bytes(b),
                    (ImageInput::Uri(u), None) => match ImageSource::parse_uri(u) {
                        Ok(s) => s,
                        Err(source) => {
                            return Outcome::of::<()>(&Err(ModelError::Image { index: 0, source }))
                        }
                    },
                    _ => unreachable!(),
                };
                match op {
                    "plan" => Outcome::of(&m.plan(src)),
                    "prepare" => Outcome::of(
                        &m.preprocessor()
                            .prepare(src)
                            .map_err(|source| ModelError::Image { index: 0, source }),
                    ),
                    _ => Outcome::of(&m.encode(&[src])),
                }
            };
            for (f, m) in models.iter().enumerate() {
                c.script.push_str(&line(&[&"plan", &f, &arg]));
                c.expects.push(Expect {
                    id: id.clone(),
                    label: format!("plan ({})", FAMILIES[f]),
                    cmd: "plan",
                    op: Op::Image,
                    allowed: expect("plan"),
                    rust: call(m, "plan"),
                });
            }
            // Encode on one family: every image that the processor refuses (cheap: it fails
            // before the tower), and the committed files that it takes (as the library test).
            let fam = case["family"].as_str().map_or(index % FAMILIES.len(), |f| {
                FAMILIES.iter().position(|x| *x == f).expect("family")
            });
            let committed = src.get("derive").is_none()
                && src.get("uri_gen").is_none()
                && case["lib_encode"] != false;
            let prepared = call(&models[fam], "prepare");
            if prepared.class != "ok" || committed {
                let out = dir.join(format!("c{index}.rows"));
                c.script
                    .push_str(&line(&[&"encode", &fam, &out.display(), &arg]));
                c.expects.push(Expect {
                    id: id.clone(),
                    label: format!("encode ({})", FAMILIES[fam]),
                    cmd: "encode",
                    op: Op::Image,
                    allowed: expect("prepare"),
                    rust: call(&models[fam], "encode"),
                });
            }
        } else if let Some(inputs) = case.get("inputs") {
            let base = case["model"]["base"].as_str().expect("base");
            let slot = FAMILIES
                .iter()
                .position(|f| base == format!("models/{f}"))
                .expect("an inputs case on a family's fixture model");
            let file = corpus().join(inputs["file"].as_str().expect("file"));
            let list = match tensors_of_file(&file, |_| true) {
                Ok(l) => l,
                Err(_) => {
                    c.unreadable_inputs += 1;
                    continue;
                }
            };
            assert!(
                list.iter()
                    .all(|(n, s, _)| !n.contains(['\t', '\n']) && s.len() <= 8),
                "{id}: a tensor name or rank the script cannot carry"
            );
            let rust = Outcome::of(&match processor_tensors(&list) {
                Ok(t) => models[slot].encode_tensors(&t),
                Err(e) => panic!("{id}: {e}"),
            });
            c.script
                .push_str(&tensor_script(&list, dir, &format!("c{index}")));
            c.expects.push(Expect {
                id: id.clone(),
                label: "tensors_new".into(),
                cmd: "tensors_new",
                op: Op::Inputs,
                allowed: vec!["ok".into()],
                rust: Outcome::of::<()>(&Ok(())),
            });
            for (name, _, v) in &list {
                c.expects.push(Expect {
                    id: id.clone(),
                    label: format!("add {name}"),
                    cmd: match v {
                        TensorValues::F32(_) => "tensor_f32",
                        TensorValues::I64(_) => "tensor_i64",
                    },
                    op: Op::Inputs,
                    allowed: vec!["ok".into()],
                    rust: Outcome::of::<()>(&Ok(())),
                });
            }
            let out = dir.join(format!("c{index}.rows"));
            c.script
                .push_str(&line(&[&"encode_tensors", &slot, &out.display()]));
            c.expects.push(Expect {
                id: id.clone(),
                label: "encode_tensors".into(),
                cmd: "encode_tensors",
                op: Op::Inputs,
                allowed: expect("encode_inputs"),
                rust,
            });
        } else {
            let path = materialize_model(&case["model"], &dir.join(format!("m{index}")));
            let gguf = path.extension() == Some(std::ffi::OsStr::new("gguf"));
            let mst = if gguf { 70 } else { 0 };
            let opened = Model::open_with(
                &path,
                &TowerOptions {
                    device: Device::Cpu,
                    ..TowerOptions::default()
                },
                settings(mst),
            );
            c.script.push_str(&line(&[&"free", &CASE_SLOT]));
            c.script.push_str(&line(&[
                &"open",
                &CASE_SLOT,
                &path.display(),
                &"cpu",
                &0,
                &mst,
                &0,
                &0,
                &0,
            ]));
            c.expects.push(Expect {
                id: id.clone(),
                label: "open".into(),
                cmd: "open",
                op: Op::Model,
                allowed: expect("open"),
                rust: Outcome::of(&opened),
            });
            if let Ok(m) = &opened {
                c.script
                    .push_str(&line(&[&"plan", &CASE_SLOT, &file_arg(&tiny_path)]));
                c.expects.push(Expect {
                    id: id.clone(),
                    label: "plan".into(),
                    cmd: "plan",
                    op: Op::Model,
                    allowed: expect("plan"),
                    rust: Outcome::of(&m.plan(ImageSource::Bytes(&tiny))),
                });
                let out = dir.join(format!("m{index}.rows"));
                c.script.push_str(&line(&[
                    &"encode",
                    &CASE_SLOT,
                    &out.display(),
                    &file_arg(&tiny_path),
                ]));
                c.expects.push(Expect {
                    id: id.clone(),
                    label: "encode".into(),
                    cmd: "encode",
                    op: Op::Model,
                    allowed: expect("encode"),
                    rust: Outcome::of(&m.encode(&[ImageSource::Bytes(&tiny)])),
                });
            }
        }
    }
    c
}

/// Runs the corpus's script and checks every line; returns (C operations, statuses seen).
fn run_corpus(c: &Corpus, under: Under, name: &str) -> (usize, BTreeMap<String, usize>, f64) {
    let run = run_script(&c.script, under, name);
    let lines: Vec<&Line> = run
        .lines
        .iter()
        .filter(|l| l.cmd() != "run" && l.cmd() != "free")
        .collect();
    assert_eq!(
        lines.len(),
        c.expects.len(),
        "{name}: {} result lines for {} operations",
        lines.len(),
        c.expects.len()
    );
    let mut failures = Vec::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for (l, e) in lines.iter().zip(&c.expects) {
        let what = format!("{} [{}]", e.id, e.label);
        *seen.entry(l.status().to_string()).or_default() += 1;
        if l.cmd() != e.cmd {
            failures.push(format!("{what}: line {:?} out of step", l.0));
            continue;
        }
        let documented = statuses(&e.rust.class, e.op);
        if !documented.contains(&l.status()) {
            failures.push(format!(
                "{what}: status {} (\"{}\"); the Rust API gave {} (\"{}\"), documented as {:?}",
                l.status(),
                l.message(),
                e.rust.class,
                e.rust.message,
                documented
            ));
        }
        let allowed: Vec<&str> = e.allowed.iter().flat_map(|a| statuses(a, e.op)).collect();
        if !allowed.contains(&l.status()) {
            failures.push(format!(
                "{what}: status {} is not one the manifest's classes {:?} map to ({allowed:?})",
                l.status(),
                e.allowed
            ));
        }
        let message = e.rust.message.replace(['\t', '\n'], " ");
        if l.message() != message {
            failures.push(format!(
                "{what}: message {:?}, the Rust API's {:?}",
                l.message(),
                message
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{name}: {} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    (c.expects.len(), seen, run.seconds)
}

fn family_models() -> Vec<Model> {
    FAMILIES
        .iter()
        .map(|f| open_cpu(&format!("models/{f}"), 0))
        .collect()
}

#[test]
fn every_adversarial_case_gives_its_documented_status_and_message() {
    let start = Instant::now();
    let models = family_models();
    let dir = scratch("corpus");
    let c = build_corpus(|_, _| true, &models, &dir);
    let rust_s = start.elapsed().as_secs_f64();
    let (ops, seen, c_s) = run_corpus(&c, Under::Plain, "corpus");
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!(
        "corpus: {} cases in {} classes {:?}, {ops} C operations, statuses {seen:?}; {} inputs \
         files refused by the safetensors reader before the C ABI; Rust side {rust_s:.1} s, C \
         program {c_s:.1} s",
        c.classes.values().sum::<usize>(),
        c.classes.len(),
        c.classes,
        c.unreadable_inputs
    );
    assert_eq!(c.classes.len(), 12, "every hostile class: {:?}", c.classes);
}

// ---------------------------------------------------------------------------------------------
// valgrind
// ---------------------------------------------------------------------------------------------

fn valgrind_present() -> bool {
    std::process::Command::new("valgrind")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Per class of the corpus, its first case that the manifest expects a refusal for (some
/// operation may not succeed), else its first case.
fn valgrind_cases() -> std::collections::BTreeSet<String> {
    let text = std::fs::read_to_string(corpus().join("manifest.json")).expect("manifest.json");
    let manifest: Value = serde_json::from_str(&text).expect("manifest is JSON");
    let mut first: BTreeMap<String, (Option<String>, String)> = BTreeMap::new();
    for case in manifest["cases"].as_array().expect("cases") {
        if case.get("known_failing").is_some() {
            continue;
        }
        let id = case["id"].as_str().expect("id").to_string();
        let refused = case["expect"]
            .as_object()
            .is_some_and(|ops| ops.values().any(|v| !strs(v).iter().any(|c| c == "ok")));
        let e = first
            .entry(case["class"].as_str().expect("class").to_string())
            .or_insert((None, id.clone()));
        if refused && e.0.is_none() {
            e.0 = Some(id);
        }
    }
    first
        .into_values()
        .map(|(r, any)| r.unwrap_or(any))
        .collect()
}

/// valgrind memcheck over the C test: plans on three families, and on glm_ocr the library's
/// rows, the caller's buffer, too small, tensors and threads; the NULL and bad arguments, the
/// caught panic, and one case of every adversarial class ([`valgrind_cases`]).
#[test]
fn valgrind_finds_no_error_and_no_leak() {
    // CI and the development machines have it: a run without it must not pass for one with it.
    assert!(
        valgrind_present(),
        "valgrind is not installed: the memcheck of the C test cannot run"
    );
    let start = Instant::now();
    let mut script = String::new();
    let mut checks = Vec::new();
    let tiny = fixtures().join("images/tiny_20x15.png");
    // The tower's arithmetic is the same Rust whatever calls it: encode on the cheapest family
    // (glm_ocr), plan on the others.
    let two = ["tiny_20x15.png", "logo_rgba_112x84.png"];
    for (model, encodes) in [
        ("models/glm_ocr", Encodes::AllAndThreads),
        ("models/gemma4", Encodes::None),
        ("models/step3p7", Encodes::None),
    ] {
        let p = parity(0, model, 0, &two, encodes);
        script.push_str(&p.script);
        checks.extend(p.checks);
    }
    let p = tensor_parity(1, "models/glm_ocr", "glm_ocr/batch2");
    script.push_str(&p.script);
    checks.extend(p.checks);
    let failures = {
        script.push_str(&line(&[
            &"open",
            &0,
            &fixtures().join("models/gemma4").display(),
            &"cpu",
            &0,
            &0,
            &0,
            &0,
            &0,
        ]));
        script.push_str(&line(&[
            &"nulls",
            &0,
            &file_arg(&tiny),
            &fixtures().join("models/gemma4").display(),
        ]));
        script.push_str(&line(&[&"panic"]));
        script.push_str(&line(&[&"free", &0]));
        let run = run_script(&script, Under::Valgrind, "valgrind-parity");
        let n = run.lines.len();
        let mut f = verify(&checks, &run.lines[..n - 4]);
        if run.lines[n - 3].0 != ["nulls", "ok"] {
            f.push(format!("nulls: {:?}", run.lines[n - 3].0));
        }
        if run.lines[n - 2].status() != "VT_ERR_PANIC" {
            f.push(format!("panic: {:?}", run.lines[n - 2].0));
        }
        eprintln!("valgrind: parity script {:.1} s", run.seconds);
        f
    };
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // One case of every class.
    let models = family_models();
    let dir = scratch("valgrind-corpus");
    let chosen = valgrind_cases();
    let c = build_corpus(
        |_, case| chosen.contains(case["id"].as_str().unwrap_or_default()),
        &models,
        &dir,
    );
    let (ops, seen, c_s) = run_corpus(&c, Under::Valgrind, "valgrind-corpus");
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!(
        "valgrind: corpus subset of {} cases ({} classes), {ops} C operations, statuses \
         {seen:?}, {c_s:.1} s; all {:.1} s",
        c.classes.values().sum::<usize>(),
        c.classes.len(),
        start.elapsed().as_secs_f64()
    );
}

// ---------------------------------------------------------------------------------------------
// Examples
// ---------------------------------------------------------------------------------------------

#[test]
fn the_c_example_builds_against_the_shared_library_and_runs() {
    let lib = lib_dir();
    let out = scratch("examples").join("encode_c");
    let src = crate_dir().join("examples/c/encode.c");
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
    let run = command(&out)
        .arg(fixtures().join("models/gemma4"))
        .arg(fixtures().join("images/coffee_144x96.jpg"))
        .arg("cpu")
        .output()
        .expect("the example runs");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let m = open_cpu("models/gemma4", 0);
    let bytes = std::fs::read(fixtures().join("images/coffee_144x96.jpg")).unwrap();
    let rows = m.encode(&[ImageSource::Bytes(&bytes)]).unwrap();
    let want = format!("rows {} width {}", rows[0].plan.rows, m.width());
    assert!(stdout.contains(&want), "{stdout} lacks {want:?}");
    assert!(stdout.contains("family gemma4"), "{stdout}");
    // The example's refusal path: a file that is not an image.
    let bad = command(&out)
        .arg(fixtures().join("models/gemma4"))
        .arg(fixtures().join("models/gemma4/config.json"))
        .arg("cpu")
        .output()
        .expect("the example runs");
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("VT_ERR_IMAGE") && stderr.contains("not an image"),
        "{stderr}"
    );
}

#[test]
fn the_cpp_example_builds_against_the_static_library_and_runs() {
    let lib = lib_dir();
    let out = scratch("examples").join("engine_cpp");
    let src = crate_dir().join("examples/cpp/engine.cpp");
    let inc = include_dir();
    let archive = lib.join("libvision_towers_c.a");
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "-std=c++17".as_ref(),
        "-Wall".as_ref(),
        "-Wextra".as_ref(),
        "-Werror".as_ref(),
        "-I".as_ref(),
        inc.as_os_str(),
        src.as_os_str(),
        "-o".as_ref(),
        out.as_os_str(),
        archive.as_os_str(),
    ];
    args.extend(STATIC_LIBS.iter().map(std::ffi::OsStr::new));
    compile(&cxx(), &args);
    let images = ["tiny_20x15.png", "logo_rgba_112x84.png"];
    let mut cmd = command(&out);
    cmd.arg(fixtures().join("models/glm5_next")).arg("cpu");
    for i in images {
        cmd.arg(fixtures().join("images").join(i));
    }
    let run = cmd.output().expect("the example runs");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    // The prompt it lays out: per image, the image token repeated rows times, and the rows
    // spliced in agree with the Rust API's.
    let m = open_cpu("models/glm5_next", 0);
    let bytes: Vec<Vec<u8>> = images
        .iter()
        .map(|i| std::fs::read(fixtures().join("images").join(i)).unwrap())
        .collect();
    let sources: Vec<ImageSource<'_>> = bytes.iter().map(|b| ImageSource::Bytes(b)).collect();
    let enc = m.encode(&sources).unwrap();
    let total: u64 = enc.iter().map(|e| e.plan.rows).sum();
    let sum: f64 = enc
        .iter()
        .flat_map(|e| e.rows.iter())
        .map(|&v| f64::from(v))
        .sum();
    let want_rows = format!("embedded {total} rows");
    assert!(stdout.contains(&want_rows), "{stdout} lacks {want_rows:?}");
    let got_sum: f64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("checksum "))
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no checksum line in {stdout}"));
    assert!(
        (got_sum - sum).abs() <= 1e-6 * sum.abs().max(1.0),
        "checksum {got_sum}, Rust {sum}"
    );
}
