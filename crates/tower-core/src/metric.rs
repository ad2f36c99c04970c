//! The distance between rows and their reference.

/// `‖out − reference‖₂ / ‖reference‖₂`, accumulated in f64 over f32 or f64 values: the measure
/// of every bound in the test suites and tables (host f32 ≤ 1e-5, CUDA f32 ≤ 1e-4, bf16 ≤ 2e-2
/// against the f64 oracle).
///
/// Edge cases, so that a broken output can never pass: a length mismatch gives +∞, any NaN gives
/// NaN, and a zero reference gives `‖out‖₂` (0 only when the output is zero too).
pub fn rel_l2<A, B>(out: &[A], reference: &[B]) -> f64
where
    A: Copy + Into<f64>,
    B: Copy + Into<f64>,
{
    if out.len() != reference.len() {
        return f64::INFINITY;
    }
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&o, &r) in out.iter().zip(reference) {
        let (o, r): (f64, f64) = (o.into(), r.into());
        num += (o - r) * (o - r);
        den += r * r;
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values worked by hand: ‖(3, 4) − (0, 0)‖ … and the edge cases.
    #[test]
    fn rel_l2_by_hand_and_at_its_edges() {
        assert_eq!(rel_l2(&[1.0f32, 2.0], &[1.0f64, 2.0]), 0.0);
        // out − ref = (0, 1), ‖ref‖ = √(3² + 4²) = 5
        assert!((rel_l2(&[3.0f32, 5.0], &[3.0f32, 4.0]) - 0.2).abs() < 1e-15);
        assert_eq!(rel_l2(&[3.0f64, 4.0], &[0.0f64, 0.0]), 5.0);
        assert_eq!(rel_l2(&[1.0f32], &[1.0f32, 2.0]), f64::INFINITY);
        assert!(rel_l2(&[f32::NAN, 1.0], &[1.0f32, 1.0]).is_nan());
        assert!(rel_l2(&[1.0f32, 1.0], &[f64::NAN, 1.0]).is_nan());
        assert_eq!(rel_l2::<f32, f32>(&[], &[]), 0.0);
    }
}
