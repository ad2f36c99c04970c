//! Progress lines on stdout, stamped with the seconds since the command started.
use std::time::Instant;

/// When the command started: the first call of this (each command calls it first).
pub fn started() -> &'static Instant {
    static T0: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    T0.get_or_init(Instant::now)
}

/// One progress line, `[   12.3 s] tag: msg`.
pub fn say(tag: &str, msg: std::fmt::Arguments<'_>) {
    println!("[{:7.1} s] {tag}: {msg}", started().elapsed().as_secs_f64());
}
