#![no_main]
//! JPEG bytes through vision-prep's own baseline decode (its entropy decode split 1 to 8 ways,
//! chosen by the first byte) and through libjpeg: must never panic, and wherever our decode does
//! not decline, its bytes must be libjpeg's.

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else { return };
    let threads = usize::from(sel % 8) + 1;
    let agrees = vision_prep::fuzzing::own_jpeg_agrees_with_libjpeg(body, threads, 1 << 20);
    assert_ne!(agrees, Some(false), "our decode differs from libjpeg's ({threads} ways)");
});
