//! `cargo xtask parity`: run every available path against every oracle fixture and print one
//! table (variant, source, case, stage, precision, rel-L2 vs the float64 reference, bound,
//! verdict). Exits non-zero on any failure; "not implemented" is not a failure (and never a pass).
//!
//! A tower plugs in by implementing [`Runner`] and adding it to [`runners`]: given a fixture
//! case it returns the named stage activations (`patch_embed`, `block_0`, …, `rows`, the names
//! in the case's `stages` metadata) or [`Outcome::NotImplemented`].
use anyhow::{bail, Result};
use std::path::Path;

use crate::parity_case::{
    discover, inputs_case, rel_l2, verdict, Arith, Case, Outcome, Runner, Tensor, Verdict,
};

/// Placeholder for a path that has no implementation yet.
struct Pending {
    variants: &'static [&'static str],
    source: &'static str,
    precision: Arith,
}

impl Runner for Pending {
    fn source(&self) -> &str {
        self.source
    }
    fn precision(&self) -> Arith {
        self.precision
    }
    fn applies(&self, variant: &str) -> bool {
        self.variants.contains(&variant)
    }
    fn run(&self, _: &Path, _: &Case) -> Outcome {
        Outcome::NotImplemented
    }
}

/// Weight sources per variant (the mini repositories under `fixtures/models/`).
const SOURCES: [(&[&str], &str); 8] = [
    (&["gemma4", "gemma4_clipped"], "hf"),
    (&["gemma4", "gemma4_clipped"], "gguf-bf16"),
    (&["gemma4"], "gguf-f16"),
    (&["glm5_next"], "hf"),
    (&["glm_ocr"], "hf"),
    (&["step3p7"], "vendor"),
    (&["step3p7"], "sharded"),
    (&["step3p7"], "hf-layout"),
];

/// The registry. A tower crate replaces the matching `Pending` entry with its runner.
pub fn runners() -> Vec<Box<dyn Runner>> {
    let mut v: Vec<Box<dyn Runner>> = Vec::new();
    for (variants, source) in SOURCES {
        for precision in Arith::ALL {
            match crate::towers::runner(variants, source, precision)
                .or_else(|| crate::towers_glm::runner(variants, source, precision))
                .or_else(|| crate::towers_step::runner(variants, source, precision))
            {
                Some(r) => v.push(r),
                None => v.push(Box::new(Pending {
                    variants,
                    source,
                    precision,
                })),
            }
        }
    }
    v
}

// ---------------------------------------------------------------------------------------------
// the table
// ---------------------------------------------------------------------------------------------

/// One line of the table.
pub struct Row {
    variant: String,
    source: String,
    case: String,
    stage: String,
    precision: Arith,
    rel: Option<f64>,
    verdict: Verdict,
    note: String,
}

/// Compares one runner's outcome on one case against the float64 references.
pub fn rows_for(runner: &dyn Runner, fixtures: &Path, case: &Case) -> Vec<Row> {
    let row = |stage: &str, rel: Option<f64>, verdict: Verdict, note: String| Row {
        variant: case.variant.clone(),
        source: runner.source().to_string(),
        case: case.name.clone(),
        stage: stage.to_string(),
        precision: runner.precision(),
        rel,
        verdict,
        note,
    };
    if let Arith::Cuda(p) = runner.precision() {
        if let Ok(dev) = crate::parity_device::shared_device() {
            if let Some(why) = dev.precision_refusal(p) {
                return vec![row("*", None, Verdict::Refused, why)];
            }
        }
    }
    match runner.run(fixtures, case) {
        Outcome::NotImplemented => vec![row("*", None, Verdict::NotImplemented, String::new())],
        Outcome::Error(e) => vec![row("*", None, Verdict::Fail, e)],
        Outcome::NoDevice(why) => vec![row("*", None, Verdict::NotRun, why)],
        Outcome::Ran(out) => {
            let bound = runner.precision().bound();
            case.stages()
                .iter()
                .map(
                    |stage| match (out.get(stage), case.tensor(&format!("f64/{stage}"))) {
                        (None, _) => row(
                            stage,
                            None,
                            Verdict::Fail,
                            "stage missing from output".into(),
                        ),
                        (_, Err(e)) => row(stage, None, Verdict::Fail, format!("{e:#}")),
                        (Some(o), Ok(r)) => {
                            let r = unpadded(case, r);
                            let rel = rel_l2(o, &r.data);
                            let note = if o.len() != r.data.len() {
                                format!("length {} vs reference {:?}", o.len(), r.shape)
                            } else {
                                String::new()
                            };
                            row(stage, Some(rel), verdict(rel, bound), note)
                        }
                    },
                )
                .collect()
        }
    }
}

/// gemma4 batches are padded to `max_patches` rows per image; padding rows (positions (−1, −1)
/// in `image_position_ids`) carry no meaning and a padding-free path does not produce them. A
/// reference `[B, P, H]` whose `[B, P]` matches the positions is reduced to its valid rows, in
/// order; any other reference is returned as it is.
fn unpadded(case: &Case, reference: Tensor) -> Tensor {
    let fixtures = crate::fixtures::fixtures_dir();
    let Ok(pos) = inputs_case(&fixtures, case).and_then(|c| c.tensor("image_position_ids")) else {
        return reference;
    };
    let (b, p) = match pos.shape[..] {
        [b, p, 2] => (b, p),
        _ => return reference,
    };
    let h = match reference.shape[..] {
        [rb, rp, h] if rb == b && rp == p => h,
        _ => return reference,
    };
    let mut data = Vec::with_capacity(reference.data.len());
    let mut rows = 0;
    for (i, xy) in pos.data.chunks_exact(2).enumerate() {
        if xy != [-1.0, -1.0] {
            data.extend_from_slice(&reference.data[i * h..(i + 1) * h]);
            rows += 1;
        }
    }
    Tensor {
        shape: vec![rows, h],
        data,
    }
}

/// Usage of `cargo xtask parity`.
const USAGE: &str = "usage: cargo xtask parity [--require-cuda]";

/// Entry point of `cargo xtask parity [--require-cuda]`.
///
/// Exits non-zero on any failed row. CUDA rows read "not run" only where this machine has no
/// CUDA at all; where CUDA is required (`--require-cuda`, or automatically when a GPU is present)
/// a CUDA row that did not run is a failure too.
pub fn run(args: &[String]) -> Result<()> {
    let mut require_cuda = None;
    for a in args {
        match a.as_str() {
            "--require-cuda" => require_cuda = Some("--require-cuda was given".to_string()),
            other => bail!("unknown argument `{other}`\n{USAGE}"),
        }
    }
    if require_cuda.is_none() && crate::parity_device::gpu_present() {
        require_cuda = Some(format!(
            "a GPU is present (the CUDA driver reports a device, or {} is set)",
            crate::parity_device::SIMULATE_GPU_ENV
        ));
    }
    let fixtures = crate::fixtures::fixtures_dir();
    let cases = discover(&fixtures)?;
    let towers: Vec<&Case> = cases.iter().filter(|c| c.kind() == "tower").collect();
    let n_proc = cases.iter().filter(|c| c.kind() == "processor").count();
    if towers.is_empty() {
        bail!(
            "no tower fixture case under {}: nothing to compare",
            fixtures.join("outputs").display()
        );
    }
    println!(
        "fixture cases found: {} ({} tower cases with stage references, {} processor cases) under {}",
        cases.len(),
        towers.len(),
        n_proc,
        fixtures.join("outputs").display()
    );
    let runners = runners();
    let mut rows = Vec::new();
    for case in &towers {
        for r in runners.iter().filter(|r| r.applies(&case.variant)) {
            rows.extend(rows_for(r.as_ref(), &fixtures, case));
        }
    }
    print_table(&rows);
    let count = |v: Verdict| rows.iter().filter(|r| r.verdict == v).count();
    let (pass, fail, ni, nr) = (
        count(Verdict::Pass),
        count(Verdict::Fail),
        count(Verdict::NotImplemented),
        count(Verdict::NotRun),
    );
    let refused = count(Verdict::Refused);
    println!(
        "\n{pass} pass, {fail} fail, {ni} not implemented, {nr} not run (no device), {refused} \
         refused by the device's tier"
    );
    if let Ok(dev) = crate::parity_device::shared_device() {
        println!("GPU tier: {}", dev.tier());
    }
    judge(&rows, require_cuda.as_deref())
}

/// The command's verdict over the table: an error when a row failed, or when `require_cuda`
/// (why CUDA is required) is given and a CUDA row did not run (not run, or not implemented).
fn judge(rows: &[Row], require_cuda: Option<&str>) -> Result<()> {
    let fail = rows.iter().filter(|r| r.verdict == Verdict::Fail).count();
    if fail > 0 {
        bail!("{fail} parity rows failed");
    }
    if let Some(why) = require_cuda {
        let idle: Vec<&Row> = rows
            .iter()
            .filter(|r| r.precision != Arith::HostF32)
            .filter(|r| matches!(r.verdict, Verdict::NotRun | Verdict::NotImplemented))
            .collect();
        if let Some(first) = idle.first() {
            let note = if first.note.is_empty() {
                first.verdict.to_string()
            } else {
                first.note.clone()
            };
            bail!(
                "{} CUDA parity rows did not run ({note}) and CUDA is required: {why}",
                idle.len()
            );
        }
    }
    Ok(())
}

fn print_table(rows: &[Row]) {
    let head = [
        "variant",
        "source",
        "case",
        "stage",
        "precision",
        "rel-L2",
        "bound",
        "verdict",
    ];
    let cells: Vec<[String; 8]> = rows
        .iter()
        .map(|r| {
            [
                r.variant.clone(),
                r.source.clone(),
                r.case.clone(),
                r.stage.clone(),
                r.precision.to_string(),
                r.rel.map_or("-".into(), |x| format!("{x:.2e}")),
                format!("{:.0e}", r.precision.bound()),
                if r.note.is_empty() {
                    r.verdict.to_string()
                } else {
                    format!("{} ({})", r.verdict, r.note)
                },
            ]
        })
        .collect();
    let mut w = head.map(str::len);
    for c in &cells {
        for (i, s) in c.iter().enumerate() {
            w[i] = w[i].max(s.len());
        }
    }
    let line = |c: &[String]| {
        c.iter()
            .enumerate()
            .map(|(i, s)| format!("{s:<width$}", width = w[i]))
            .collect::<Vec<_>>()
            .join("  ")
    };
    println!("{}", line(&head.map(String::from)));
    println!(
        "{}",
        w.iter()
            .map(|&n| "-".repeat(n))
            .collect::<Vec<_>>()
            .join("  ")
    );
    for c in &cells {
        println!("{}", line(c));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parity_case::Precision;
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    #[test]
    fn rel_l2_hand_derived() {
        // ref = (3, 4): ‖ref‖ = 5; out − ref = (0, 0.5): ‖·‖ = 0.5 → 0.1
        assert!((rel_l2(&[3.0, 4.5], &[3.0, 4.0]) - 0.1).abs() < 1e-15);
        // ref = (1, 2, 2): ‖ref‖ = 3; out − ref = (0, 0, 6e-6) → 2e-6
        assert!((rel_l2(&[1.0, 2.0, 2.000006], &[1.0, 2.0, 2.0]) - 2e-6).abs() < 1e-12);
        assert_eq!(rel_l2(&[1.0], &[1.0, 2.0]), f64::INFINITY);
        assert_eq!(rel_l2(&[0.0, 0.0], &[0.0, 0.0]), 0.0);
    }

    #[test]
    fn verdict_against_bounds() {
        let r = rel_l2(&[1.0, 2.0, 2.000006], &[1.0, 2.0, 2.0]); // 2e-6
        assert_eq!(verdict(r, Arith::HostF32.bound()), Verdict::Pass);
        let r = rel_l2(&[3.0, 4.5], &[3.0, 4.0]); // 0.1
        assert_eq!(
            verdict(r, Arith::Cuda(Precision::Bf16).bound()),
            Verdict::Fail
        );
        let r = rel_l2(&[3.0, 4.05], &[3.0, 4.0]); // 0.01
        assert_eq!(
            verdict(r, Arith::Cuda(Precision::Bf16).bound()),
            Verdict::Pass
        );
        assert_eq!(
            verdict(r, Arith::Cuda(Precision::F32).bound()),
            Verdict::Fail
        );
    }

    #[test]
    fn nan_never_passes() {
        let r = rel_l2(&[f64::NAN, 4.0], &[3.0, 4.0]);
        assert!(r.is_nan());
        assert_eq!(verdict(r, f64::INFINITY), Verdict::Fail);
        assert_eq!(verdict(f64::INFINITY, f64::INFINITY), Verdict::Fail);
    }

    #[test]
    fn not_implemented_is_neither_pass_nor_fail() {
        let fixtures = crate::fixtures::fixtures_dir();
        let cases = discover(&fixtures).unwrap();
        let case = cases
            .iter()
            .find(|c| c.kind() == "tower")
            .expect("a tower fixture");
        let pending = Pending {
            variants: &["gemma4"],
            source: "hf",
            precision: Arith::Cuda(Precision::F32),
        };
        let rows = rows_for(&pending, &fixtures, case);
        assert!(rows.iter().all(|r| r.verdict == Verdict::NotImplemented));
    }

    #[test]
    fn no_device_is_not_run_neither_pass_nor_fail() {
        struct Absent;
        impl Runner for Absent {
            fn source(&self) -> &str {
                "hf"
            }
            fn precision(&self) -> Arith {
                Arith::Cuda(Precision::Bf16)
            }
            fn applies(&self, _: &str) -> bool {
                true
            }
            fn run(&self, _: &Path, _: &Case) -> Outcome {
                Outcome::NoDevice("no device".into())
            }
        }
        let fixtures = crate::fixtures::fixtures_dir();
        let cases = discover(&fixtures).unwrap();
        let case = cases
            .iter()
            .find(|c| c.kind() == "tower")
            .expect("a tower fixture");
        let rows = rows_for(&Absent, &fixtures, case);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].verdict, Verdict::NotRun);
        assert_eq!(rows[0].note, "no device");
        assert_eq!(Verdict::NotRun.to_string(), "not run");
    }

    /// A CUDA path whose device did not open for the reason `self.0`, as the tower runners report it.
    struct Unopened(crate::parity_device::NoCuda, Arith);
    impl Runner for Unopened {
        fn source(&self) -> &str {
            "hf"
        }
        fn precision(&self) -> Arith {
            self.1
        }
        fn applies(&self, _: &str) -> bool {
            true
        }
        fn run(&self, _: &Path, _: &Case) -> Outcome {
            self.0.outcome()
        }
    }

    fn a_tower_case() -> (PathBuf, Case) {
        let fixtures = crate::fixtures::fixtures_dir();
        let case = discover(&fixtures)
            .unwrap()
            .into_iter()
            .find(|c| c.kind() == "tower")
            .expect("a tower fixture");
        (fixtures, case)
    }

    /// A CUDA stack that is installed but broken (here: a PTX module that cannot be read, as with
    /// an invalid `GPU_CORE_PTX_DIR`) fails every CUDA row with the reason, and the command fails,
    /// with or without `--require-cuda`. Only gpu-core's `NoDevice` reads "not run".
    #[test]
    fn a_device_that_does_not_open_fails_every_cuda_row() {
        use crate::parity_device::{classify, NoCuda};
        use gpu_core::GpuError;
        let (fixtures, case) = a_tower_case();
        for err in [
            GpuError::Ptx {
                module: "act",
                what: "reading /nonexistent/act.ptx: No such file or directory".into(),
            },
            GpuError::Unusable("the CUDA driver panicked while creating a context".into()),
            GpuError::OutOfMemory { bytes: 32 << 20 },
        ] {
            let what = err.to_string();
            let no = classify(Err(err)).expect_err("nothing opened");
            assert!(matches!(no, NoCuda::Broken(_)), "{what}: {no:?}");
            for p in [
                Arith::Cuda(Precision::F32),
                Arith::Cuda(Precision::Bf16),
                Arith::Cuda(Precision::F16),
            ] {
                let rows = rows_for(&Unopened(no.clone(), p), &fixtures, &case);
                assert!(!rows.is_empty());
                for r in &rows {
                    assert_eq!(r.verdict, Verdict::Fail, "{what}");
                    assert!(r.note.contains(&what), "{} lacks {what}", r.note);
                }
                assert!(judge(&rows, None).is_err(), "{what}");
            }
        }
    }

    /// No CUDA at all is "not run" and passes, unless CUDA is required: then every CUDA row that
    /// did not run fails the command, which says why.
    #[test]
    fn require_cuda_fails_when_a_cuda_row_did_not_run() {
        use crate::parity_device::{classify, NoCuda};
        let (fixtures, case) = a_tower_case();
        let no = classify(Err(gpu_core::GpuError::NoDevice(
            "the CUDA driver library (libcuda.so.1) is not installed".into(),
        )))
        .expect_err("nothing opened");
        assert!(matches!(no, NoCuda::Absent(_)));
        let mut rows = rows_for(
            &Unopened(no, Arith::Cuda(Precision::Bf16)),
            &fixtures,
            &case,
        );
        assert!(rows.iter().all(|r| r.verdict == Verdict::NotRun));
        assert!(judge(&rows, None).is_ok());
        let err = judge(&rows, Some("--require-cuda was given")).expect_err("required");
        let msg = format!("{err:#}");
        assert!(msg.contains("--require-cuda was given"), "{msg}");
        assert!(msg.contains("libcuda.so.1"), "{msg}");
        // a CUDA path that does not exist yet did not run either
        let pending = Pending {
            variants: &["gemma4"],
            source: "hf",
            precision: Arith::Cuda(Precision::F32),
        };
        let ni = rows_for(&pending, &fixtures, &case);
        assert!(judge(&ni, Some("a GPU is present")).is_err());
        // host rows are never required to be CUDA rows
        let host = Pending {
            variants: &["gemma4"],
            source: "hf",
            precision: Arith::HostF32,
        };
        rows = rows_for(&host, &fixtures, &case);
        assert!(judge(&rows, Some("--require-cuda was given")).is_ok());
    }

    /// Missing fixtures are an error naming the directory, never an empty table that passes.
    #[test]
    fn missing_fixtures_are_an_error_not_a_pass() {
        let err = discover(Path::new("/nonexistent/fixtures")).expect_err("missing");
        let msg = format!("{err:#}");
        assert!(msg.contains("/nonexistent/fixtures/outputs"), "{msg}");
        assert!(msg.contains("fixtures are missing"), "{msg}");
    }

    #[test]
    fn parity_refuses_unknown_arguments() {
        let err = run(&["--require-gpu".to_string()]).expect_err("unknown");
        assert!(format!("{err:#}").contains("--require-cuda"));
    }

    /// A runner that echoes the f64 reference passes every stage at every precision; the f32
    /// upstream activations pass the host-f32 bound (sanity of the fixture files themselves).
    #[test]
    fn fixture_references_are_consistent() {
        struct Echo(&'static str);
        impl Runner for Echo {
            fn source(&self) -> &str {
                "echo"
            }
            fn precision(&self) -> Arith {
                Arith::HostF32
            }
            fn applies(&self, _: &str) -> bool {
                true
            }
            fn run(&self, _: &Path, case: &Case) -> Outcome {
                let mut m = BTreeMap::new();
                for s in case.stages() {
                    match case.tensor(&format!("{}/{s}", self.0)) {
                        Ok(t) => m.insert(s, unpadded(case, t).data),
                        Err(e) => return Outcome::Error(format!("{e:#}")),
                    };
                }
                Outcome::Ran(m)
            }
        }
        let fixtures = crate::fixtures::fixtures_dir();
        let cases = discover(&fixtures).unwrap();
        let towers: Vec<_> = cases.iter().filter(|c| c.kind() == "tower").collect();
        assert!(towers.len() >= 8, "found {} tower cases", towers.len());
        for case in towers {
            for prec in ["f64", "f32"] {
                for row in rows_for(&Echo(prec), &fixtures, case) {
                    assert_eq!(
                        row.verdict,
                        Verdict::Pass,
                        "{}/{} {} {prec}: {:?} {}",
                        case.variant,
                        case.name,
                        row.stage,
                        row.rel,
                        row.note
                    );
                }
            }
        }
    }
}
