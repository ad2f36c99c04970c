//! `tvF.normalize` of u8 RGB windows into three f32 planes: `(v − m) / s` per channel in f32.
//!
//! The portable path looks the 256 values up in a table; the AVX2 path computes them 8 at a time
//! with the same two IEEE operations (`vsubps`, `vdivps`, correctly rounded like the scalar ones),
//! so both give the table's bits, which are upstream's (tests: every value, every length).

/// Per-channel normalisation `(v − m[c]) / s[c]` of u8 pixels, and the kernel that applies it.
pub(crate) struct Normalize {
    m: [f32; 3],
    s: [f32; 3],
    lut: [[f32; 256]; 3],
    avx2: bool,
}

impl Normalize {
    /// The normalisation by mean `m` and std `s` (the fused constants, in 0..=255 units), with the
    /// AVX2 kernel where the CPU has it.
    pub(crate) fn new(m: [f32; 3], s: [f32; 3]) -> Normalize {
        Self::with_kernel(m, s, has_avx2())
    }

    fn with_kernel(m: [f32; 3], s: [f32; 3], avx2: bool) -> Normalize {
        let mut lut = [[0f32; 256]; 3];
        for (c, row) in lut.iter_mut().enumerate() {
            for (v, x) in row.iter_mut().enumerate() {
                *x = (v as f32 - m[c]) / s[c];
            }
        }
        Normalize { m, s, lut, avx2 }
    }

    /// The `w × h` window at `(x, y)` of an RGB image `stride` pixels wide, as three planes
    /// (`out[c]` holds `w·h` values, row-major). The window must lie inside `src`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn window(
        &self,
        src: &[u8],
        stride: usize,
        x: usize,
        y: usize,
        w: usize,
        h: usize,
        out: [&mut [f32]; 3],
    ) {
        let [r, g, b] = out;
        let (r, g, b) = (&mut r[..w * h], &mut g[..w * h], &mut b[..w * h]);
        #[cfg(target_arch = "x86_64")]
        if self.avx2 && w >= avx2::LANES {
            // SAFETY: `avx2` is only set when the CPU reports AVX2 (`has_avx2`); the slices are
            // bounds-checked here and `window` takes no raw pointer beyond them.
            unsafe { avx2::window(self, src, stride, x, y, w, h, [r, g, b]) };
            return;
        }
        for row in 0..h {
            let o = ((y + row) * stride + x) * 3;
            let px = &src[o..o + 3 * w];
            let k = row * w..(row + 1) * w;
            let (r, g, b) = (&mut r[k.clone()], &mut g[k.clone()], &mut b[k]);
            for (((p, r), g), b) in px.chunks_exact(3).zip(r).zip(g).zip(b) {
                *r = self.lut[0][usize::from(p[0])];
                *g = self.lut[1][usize::from(p[1])];
                *b = self.lut[2][usize::from(p[2])];
            }
        }
    }
}

fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The AVX2 kernel: 8 pixels (24 bytes) per step, each channel's bytes gathered with `pshufb`,
/// widened to i32, converted (exactly) to f32, then `(v − m) / s`. A row's last step overlaps the
/// one before it, so any width from 8 on needs no scalar tail.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::Normalize;

    /// Pixels per step.
    pub(super) const LANES: usize = 8;

    /// `pshufb` masks taking channel `c` of 8 RGB pixels from bytes 0..16 (`[c][0]`) and 16..24
    /// (`[c][1]`).
    const MASKS: [[[i8; 16]; 2]; 3] = {
        let mut m = [[[-1i8; 16]; 2]; 3];
        let mut c = 0;
        while c < 3 {
            let mut i = 0;
            while i < LANES {
                let b = 3 * i + c;
                if b < 16 {
                    m[c][0][i] = b as i8;
                } else {
                    m[c][1][i] = (b - 16) as i8;
                }
                i += 1;
            }
            c += 1;
        }
        m
    };

    /// [`Normalize::window`] for `w ≥ LANES`.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn window(
        n: &Normalize,
        src: &[u8],
        stride: usize,
        x: usize,
        y: usize,
        w: usize,
        h: usize,
        out: [&mut [f32]; 3],
    ) {
        // SAFETY: 16-byte reads of 16-byte arrays.
        let shuf = MASKS.map(|c| c.map(|m| unsafe { _mm_loadu_si128(m.as_ptr().cast()) }));
        let m = n.m.map(|v| _mm256_set1_ps(v));
        let s = n.s.map(|v| _mm256_set1_ps(v));
        let [r, g, b] = out;
        for row in 0..h {
            let o = ((y + row) * stride + x) * 3;
            let px = &src[o..o + 3 * w];
            let k = row * w..(row + 1) * w;
            let dst = [&mut r[k.clone()], &mut g[k.clone()], &mut b[k]];
            let mut i = 0;
            loop {
                let i0 = i.min(w - LANES);
                // SAFETY: `i0 + LANES ≤ w`, so bytes `3·i0 .. 3·i0 + 24` lie inside `px` (3·w
                // bytes): a 16-byte and an 8-byte read.
                let (lo, hi) = unsafe {
                    let p = px.as_ptr().add(3 * i0);
                    (_mm_loadu_si128(p.cast()), _mm_loadl_epi64(p.add(16).cast()))
                };
                for c in 0..3 {
                    let bytes = _mm_or_si128(
                        _mm_shuffle_epi8(lo, shuf[c][0]),
                        _mm_shuffle_epi8(hi, shuf[c][1]),
                    );
                    let v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
                    let v = _mm256_div_ps(_mm256_sub_ps(v, m[c]), s[c]);
                    // SAFETY: `i0 + LANES ≤ w = dst[c].len()`.
                    unsafe { _mm256_storeu_ps(dst[c].as_mut_ptr().add(i0), v) };
                }
                if i0 + LANES == w {
                    break;
                }
                i += LANES;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Normalize;

    fn planes(n: &Normalize, src: &[u8], stride: usize, win: [usize; 4]) -> Vec<u32> {
        let [x, y, w, h] = win;
        let (mut r, mut g, mut b) = (
            vec![f32::NAN; w * h],
            vec![f32::NAN; w * h],
            vec![f32::NAN; w * h],
        );
        n.window(src, stride, x, y, w, h, [&mut r, &mut g, &mut b]);
        [r, g, b].iter().flatten().map(|v| v.to_bits()).collect()
    }

    /// The AVX2 kernel gives the table's bits for every value of every channel, at every width
    /// (the overlapped last step included) and window offset, for the laws' constants.
    #[test]
    fn kernel_equals_table() {
        let clip = crate::prepare::fused(
            &crate::law::OPENAI_CLIP_MEAN,
            &crate::law::OPENAI_CLIP_STD,
            1.0 / 255.0,
        );
        let half = crate::prepare::fused(&[0.5; 3], &[0.5; 3], 1.0 / 255.0);
        let nan = f32::NAN.to_bits();
        for (m, s) in [clip, half] {
            let table = Normalize::with_kernel(m, s, false);
            let fast = Normalize::new(m, s);
            // Every value in every channel: pixel i is (i, i + 85, i + 170).
            let all: Vec<u8> = (0..256usize)
                .flat_map(|i| [i as u8, (i + 85) as u8, (i + 170) as u8])
                .collect();
            let a = planes(&table, &all, 256, [0, 0, 256, 1]);
            assert_eq!(a, planes(&fast, &all, 256, [0, 0, 256, 1]));
            assert!(!a.contains(&nan));
            // Every width and several offsets of a larger image.
            let (sw, sh) = (97, 9);
            let src: Vec<u8> = (0..sw * sh * 3).map(|i| (i * 7 % 256) as u8).collect();
            for w in 1..=40 {
                for x in [0, 1, 5, sw - w] {
                    let win = [x, 2, w, 5];
                    let a = planes(&table, &src, sw, win);
                    assert_eq!(a, planes(&fast, &src, sw, win), "w={w} x={x}");
                    assert!(!a.contains(&nan), "w={w} x={x}");
                }
            }
        }
    }
}
