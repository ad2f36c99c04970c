//! Helpers shared by the fuzz targets in `fuzz_targets/`: fixture paths, small budgets, and
//! private copies of fixture model directories that a target may write one file of per run.
//!
//! Every target must hold to one property: the library returns (`Ok` or a typed error) and never
//! panics, aborts or touches memory it does not own, whatever the bytes.

// vision-prep reports libjpeg's fatal errors by unwinding a Rust panic through the C decoder to a
// `catch_unwind`. Built with `-Cpanic=abort`, a corrupt JPEG would abort the fuzzer: a false
// crash. cargo-fuzz 0.13 does not pass `-Cpanic=abort` and the profiles in fuzz/Cargo.toml say
// `panic = "unwind"`; this refuses any build that would abort all the same.
#[cfg(not(panic = "unwind"))]
compile_error!("the fuzz targets must be built with panic = \"unwind\" (libjpeg errors unwind)");
