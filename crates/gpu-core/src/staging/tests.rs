use super::*;

#[test]
fn host_gemm_rounds_bf16_and_keeps_f32() {
    let v = vec![1.0f32, 1.0 + 1.0 / 512.0, -3.5];
    match &HostGemm::from_f32(Precision::Bf16, v.clone()) {
        HostGemm::Bf16(b) => {
            assert_eq!(
                b.iter().map(|x| x.to_f32()).collect::<Vec<_>>(),
                [1.0, 1.0, -3.5]
            )
        }
        other => panic!("{other:?}"),
    }
    let f = HostGemm::from_f32(Precision::F32, v.clone());
    assert_eq!(f, HostGemm::F32(v));
    assert_eq!(f.len(), 3);
    assert_eq!(f.precision(), Precision::F32);
}

/// A dropped batch's bf16 buffer is the next conversion's (no fresh memory per encode), and
/// what was left in it does not leak into the next batch's values.
#[test]
fn a_dropped_bf16_buffer_is_reused_and_overwritten() {
    // Larger than any other test's rows, so no other test takes it in between.
    let n = 3 << 20;
    let first = HostGemm::from_f32_parts(Precision::Bf16, &[&vec![2.0f32; n]]);
    let HostGemm::Bf16(v) = &first else {
        panic!("{first:?}")
    };
    let ptr = v.as_ptr();
    drop(first);
    let short = vec![0.5f32; n - 5];
    let second = HostGemm::from_f32_parts(Precision::Bf16, &[&short]);
    let HostGemm::Bf16(w) = &second else {
        panic!("{second:?}")
    };
    assert_eq!(w.as_ptr(), ptr, "the dropped buffer was not reused");
    assert_eq!(w.len(), n - 5);
    assert!(w.iter().all(|x| x.to_f32() == 0.5));
    // Buffers over the bound are never kept.
    recycle_bf16(Vec::with_capacity(RECYCLED_MAX_BYTES / 2 + 1));
    let pool = pool();
    assert!(pool.iter().all(|k| k.capacity() * 2 <= RECYCLED_MAX_BYTES));
    assert!(pool.len() <= RECYCLED_BUFFERS);
}

/// Stacked parts (empty ones and parts longer than a conversion chunk included) equal their
/// concatenation converted value by value, in both precisions.
#[test]
fn parts_equal_the_concatenation() {
    let a: Vec<f32> = (0..40_000).map(|i| (i as f32).sin() * 3.0).collect();
    let b = vec![1.0 + 1.0 / 512.0; 7];
    let c: Vec<f32> = (0..CONVERT_CHUNK + 3).map(|i| i as f32 / 7.0).collect();
    let parts: [&[f32]; 4] = [&a, &[], &b, &c];
    let all = parts.concat();
    assert_eq!(
        HostGemm::from_f32_parts(Precision::Bf16, &parts),
        HostGemm::Bf16(all.iter().map(|&x| bf16::from_f32(x)).collect())
    );
    assert_eq!(
        HostGemm::from_f32_parts(Precision::F32, &parts),
        HostGemm::F32(all)
    );
}

/// The branch-free rounding is `half`'s `bf16::from_f32`, bit for bit: every sign, exponent
/// and top mantissa half, with low halves at and around the tie, zero and all ones (the
/// classes its rounding and NaN rules tell apart), and a stride over all 2³² patterns.
#[test]
fn bf16_bits_is_halfs_conversion() {
    let lows = [
        0u32, 1, 0x3FFF, 0x4000, 0x7FFE, 0x7FFF, 0x8000, 0x8001, 0x8002, 0xBFFF, 0xC000, 0xFFFE,
        0xFFFF,
    ];
    let check = |x: u32| {
        let want = bf16::from_f32(f32::from_bits(x)).to_bits();
        assert_eq!(bf16_bits(x), want, "{x:#010x}");
        assert_eq!(
            non_finite_bits(x),
            !f32::from_bits(x).is_finite(),
            "{x:#010x}"
        );
    };
    for high in 0..=0xFFFFu32 {
        for &low in &lows {
            check((high << 16) | low);
        }
    }
    for x in (0..=u32::MAX).step_by(4099) {
        check(x);
    }
}

/// The checked conversion gives the unchecked one's values, names the first part holding a
/// NaN or an infinity, and `all_finite` agrees with `is_finite` value by value.
#[test]
fn finite_parts_are_checked_in_the_same_pass() {
    let a: Vec<f32> = (0..CONVERT_CHUNK * 2 + 5)
        .map(|i| (i as f32).cos() * 9.0)
        .collect();
    let mut b = a.clone();
    let mut c = a.clone();
    b[CONVERT_CHUNK + 1] = f32::INFINITY;
    c[3] = f32::NAN;
    for p in [Precision::Bf16, Precision::F16, Precision::F32] {
        assert_eq!(
            HostGemm::from_finite_f32_parts(p, &[&a, &[], &a]),
            Ok(HostGemm::from_f32_parts(p, &[&a, &[], &a]))
        );
        assert_eq!(
            HostGemm::from_finite_f32_parts(p, &[&a, &c, &b]),
            Err(NonFinite { part: 1 })
        );
        assert_eq!(
            HostGemm::from_finite_f32_parts(p, &[&a, &a, &b]),
            Err(NonFinite { part: 2 })
        );
    }
    // Non-finite values still convert as `half` does (NaN quiet, infinity kept).
    let odd = [
        f32::NAN,
        -f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        -0.0,
    ];
    let HostGemm::Bf16(got) = &HostGemm::from_f32_parts(Precision::Bf16, &[&odd]) else {
        panic!("bf16 asked")
    };
    let bits = |v: &[bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let want: Vec<bf16> = odd.iter().map(|&x| bf16::from_f32(x)).collect();
    assert_eq!(bits(got), bits(&want));
    assert!(all_finite(&a) && all_finite(&[]));
    assert!(!all_finite(&b) && !all_finite(&c));
    assert!(!all_finite(&[f32::NEG_INFINITY]));
}

/// f16: values rounded as `half`'s `f16::from_f32`; a finite f32 beyond f16's range (±65504)
/// becomes ±inf and is refused by the checked conversion like a NaN, in f16 only.
#[test]
fn f16_rounds_as_half_and_refuses_values_beyond_its_range() {
    let v = [1.0f32, 1.0 + 1.0 / 4096.0, -3.5, 65504.0, 1e-8, -0.0];
    let HostGemm::F16(got) = &HostGemm::from_f32(Precision::F16, v.to_vec()) else {
        panic!("f16 asked")
    };
    let want: Vec<u16> = v.iter().map(|&x| f16::from_f32(x).to_bits()).collect();
    assert_eq!(got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want);
    assert_eq!(
        HostGemm::from_f32(Precision::F16, v.to_vec()).precision(),
        Precision::F16
    );
    let big = [1.0f32, 70000.0];
    assert_eq!(
        HostGemm::from_finite_f32_parts(Precision::F16, &[&v, &big]),
        Err(NonFinite { part: 1 })
    );
    for p in [Precision::Bf16, Precision::F32] {
        assert!(
            HostGemm::from_finite_f32_parts(p, &[&v, &big]).is_ok(),
            "{p}"
        );
    }
}

#[test]
fn fill_copies_a_prefix_either_way() {
    // Under one spread part, one part and a bit, uneven parts, and every thread's worth and more.
    let part = SPREAD_COPY_MIN_BYTES / 4;
    for n in [
        0,
        1,
        part - 1,
        part + 3,
        700_001,
        SPREAD_COPY_THREADS * part + 5 * part + 17,
    ] {
        let src: Vec<i32> = (0..n as i32).map(|i| i.wrapping_mul(-7)).collect();
        for how in [HostCopy::OneThread, HostCopy::Spread] {
            let mut dst = vec![-1i32; n + 1000];
            fill(&mut dst, &src, how);
            assert_eq!(&dst[..n], &src[..], "{n} {how:?}");
            assert!(dst[n..].iter().all(|&x| x == -1), "{n} {how:?}");
        }
    }
}

#[test]
fn a_spread_copy_gives_each_thread_at_least_its_minimum() {
    let min = SPREAD_COPY_MIN_BYTES;
    assert_eq!(spread_threads(0, 16), 1);
    assert_eq!(spread_threads(min - 1, 16), 1);
    assert_eq!(spread_threads(2 * min, 16), 2);
    assert_eq!(spread_threads(3 * min - 1, 16), 2);
    // gemma4's 3.7 MB at batch 1: three threads; glm5_next's 25 MB: every thread allowed.
    assert_eq!(spread_threads(3_677_184, 16), 3);
    assert_eq!(spread_threads(25_317_888, 16), SPREAD_COPY_THREADS);
    assert_eq!(spread_threads(100 * min, 2), 2);
    assert_eq!(spread_threads(100 * min, 0), 1);
}

#[test]
fn recycled_bf16_gives_n_values_from_a_kept_buffer() {
    let nine = bf16::from_f32(9.0);
    drop(HostGemm::Bf16(vec![nine; 1000]));
    // Shorter: the kept values, cut.
    let v = recycled_bf16(600);
    assert_eq!(v.len(), 600);
    assert!(v.capacity() >= 1000, "the kept buffer");
    drop(HostGemm::Bf16(v));
    // Longer than its values: the kept ones, then zeros.
    let v = recycled_bf16(900);
    assert_eq!(v.len(), 900);
    assert!(v[..600].iter().all(|&x| x == nine));
    assert!(v[600..].iter().all(|&x| x == bf16::ZERO));
    // Nothing kept that holds it: fresh zeros.
    let w = recycled_bf16(5000);
    assert_eq!(w, vec![bf16::ZERO; 5000]);
}
