//! `tvF.normalize` of u8 RGB windows into three f32 planes: `(v − m) / s` per channel in f32.
//!
//! The portable path looks the 256 values up in a table; the AVX2 path computes them 8 at a time
//! with the same two IEEE operations (`vsubps`, `vdivps`, correctly rounded like the scalar ones),
//! so both give the table's bits, which are upstream's (tests: every value, every length). Where
//! the CPU has FMA and, for this mean and std, the corrected reciprocal product
//! `q = d·r; q + (d − q·s)·r` (`r = 1/s`) equals the quotient for all 256 values of every channel
//! (checked against the table when the normalisation is built), that replaces the division: one
//! multiply and two FMAs instead of a `vdivps`, whose throughput bounds the kernel.

/// A `w × h` window at `(x, y)` of an RGB image `stride` pixels wide.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Window {
    /// Pixels per row of the image.
    pub stride: usize,
    /// Left column of the window.
    pub x: usize,
    /// Top row of the window.
    pub y: usize,
    /// Width of the window.
    pub w: usize,
    /// Height of the window.
    pub h: usize,
}

impl Window {
    /// The `side × side` window at `(x, y)` of an image `stride` pixels wide.
    pub(crate) fn square(stride: usize, x: usize, y: usize, side: usize) -> Window {
        Window {
            stride,
            x,
            y,
            w: side,
            h: side,
        }
    }
}

/// Per-channel normalisation `(v − m[c]) / s[c]` of u8 pixels, and the kernel that applies it.
pub(crate) struct Normalize {
    m: [f32; 3],
    s: [f32; 3],
    lut: [[f32; 256]; 3],
    avx2: bool,
    /// `1/s[c]`, and whether the corrected product by it equals the table everywhere (FMA CPUs).
    recip: Option<[f32; 3]>,
}

impl Normalize {
    /// The normalisation by mean `m` and std `s` (the fused constants, in 0..=255 units), with the
    /// AVX2 kernel where the CPU has it.
    pub(crate) fn new(m: [f32; 3], s: [f32; 3]) -> Normalize {
        Self::with_kernel(m, s, has_avx2(), has_fma())
    }

    fn with_kernel(m: [f32; 3], s: [f32; 3], avx2: bool, fma: bool) -> Normalize {
        let mut lut = [[0f32; 256]; 3];
        for (c, row) in lut.iter_mut().enumerate() {
            for (v, x) in row.iter_mut().enumerate() {
                *x = (v as f32 - m[c]) / s[c];
            }
        }
        let r = s.map(|s| 1.0 / s);
        let exact = (0..3).all(|c| {
            lut[c].iter().enumerate().all(|(v, x)| {
                corrected_quotient(v as f32 - m[c], s[c], r[c]).to_bits() == x.to_bits()
            })
        });
        let recip = (fma && exact).then_some(r);
        Normalize {
            m,
            s,
            lut,
            avx2,
            recip,
        }
    }

    /// The window `win` of an RGB image as three planes (`out[c]` holds `w·h` values, row-major).
    /// The window must lie inside `src`.
    pub(crate) fn window(&self, src: &[u8], win: Window, out: [&mut [f32]; 3]) {
        let Window { stride, x, y, w, h } = win;
        let [r, g, b] = out;
        let (r, g, b) = (&mut r[..w * h], &mut g[..w * h], &mut b[..w * h]);
        #[cfg(target_arch = "x86_64")]
        if self.avx2 && w >= avx2::LANES {
            // SAFETY: `avx2` is only set when the CPU reports AVX2 (`has_avx2`); the slices are
            // bounds-checked here and `window` takes no raw pointer beyond them.
            match self.recip {
                // SAFETY: as above, and `recip` is only set when the CPU reports FMA.
                Some(rc) => unsafe { avx2::window_fma(self, rc, src, win, [r, g, b]) },
                None => unsafe { avx2::window(self, src, win, [r, g, b]) },
            }
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

/// `d / s` from the reciprocal `r = 1/s`: the product, corrected by its residual (two FMAs, as the
/// AVX2 kernel computes it lane by lane). Not always the correctly rounded quotient, hence the check.
fn corrected_quotient(d: f32, s: f32, r: f32) -> f32 {
    let q = d * r;
    (-q).mul_add(s, d).mul_add(r, q)
}

fn has_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
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

    use super::{Normalize, Window};

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

    /// [`Normalize::window`] for `w ≥ LANES`: `(v − m) / s` by `vdivps`.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn window(n: &Normalize, src: &[u8], win: Window, out: [&mut [f32]; 3]) {
        let m = n.m.map(|v| _mm256_set1_ps(v));
        let s = n.s.map(|v| _mm256_set1_ps(v));
        // The closure inherits this function's target features.
        let op = |v: __m256, c: usize| _mm256_div_ps(_mm256_sub_ps(v, m[c]), s[c]);
        // SAFETY: forwarded contract (AVX2).
        unsafe { each_step(src, win, out, op) }
    }

    /// [`window`] with the division replaced by the corrected product by `r = 1/s`
    /// ([`super::corrected_quotient`], which the caller checked equals the quotient).
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn window_fma(
        n: &Normalize,
        r: [f32; 3],
        src: &[u8],
        win: Window,
        out: [&mut [f32]; 3],
    ) {
        let m = n.m.map(|v| _mm256_set1_ps(v));
        let s = n.s.map(|v| _mm256_set1_ps(v));
        let r = r.map(|v| _mm256_set1_ps(v));
        // The closure inherits this function's target features.
        let op = |v: __m256, c: usize| {
            let d = _mm256_sub_ps(v, m[c]);
            let q = _mm256_mul_ps(d, r[c]);
            _mm256_fmadd_ps(_mm256_fnmadd_ps(q, s[c], d), r[c], q)
        };
        // SAFETY: forwarded contract (AVX2).
        unsafe { each_step(src, win, out, op) }
    }

    /// The loop both kernels share: 8 pixels of each row a step, channel `c`'s values converted
    /// to f32 and mapped by `op(v, c)`.
    ///
    /// # Safety
    /// The CPU must support AVX2; `w ≥ LANES`.
    #[inline(always)]
    unsafe fn each_step(
        src: &[u8],
        win: Window,
        out: [&mut [f32]; 3],
        op: impl Fn(__m256, usize) -> __m256,
    ) {
        let Window { stride, x, y, w, h } = win;
        // SAFETY: 16-byte reads of 16-byte arrays.
        let shuf = MASKS.map(|c| c.map(|m| unsafe { _mm_loadu_si128(m.as_ptr().cast()) }));
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
                    // SAFETY: AVX2 (the caller's contract).
                    let v = unsafe {
                        let bytes = _mm_or_si128(
                            _mm_shuffle_epi8(lo, shuf[c][0]),
                            _mm_shuffle_epi8(hi, shuf[c][1]),
                        );
                        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes))
                    };
                    // SAFETY: `i0 + LANES ≤ w = dst[c].len()`.
                    unsafe { _mm256_storeu_ps(dst[c].as_mut_ptr().add(i0), op(v, c)) };
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
        let win = super::Window { stride, x, y, w, h };
        n.window(src, win, [&mut r, &mut g, &mut b]);
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
            let table = Normalize::with_kernel(m, s, false, false);
            let fast = Normalize::new(m, s);
            // The laws' constants take the FMA kernel where the CPU has FMA.
            assert_eq!(fast.recip.is_some(), super::has_fma(), "m={m:?} s={s:?}");
            let div = Normalize::with_kernel(m, s, super::has_avx2(), false);
            // Every value in every channel: pixel i is (i, i + 85, i + 170).
            let all: Vec<u8> = (0..256usize)
                .flat_map(|i| [i as u8, (i + 85) as u8, (i + 170) as u8])
                .collect();
            let a = planes(&table, &all, 256, [0, 0, 256, 1]);
            assert_eq!(a, planes(&fast, &all, 256, [0, 0, 256, 1]));
            assert_eq!(a, planes(&div, &all, 256, [0, 0, 256, 1]));
            assert!(!a.contains(&nan));
            // Every width and several offsets of a larger image.
            let (sw, sh) = (97, 9);
            let src: Vec<u8> = (0..sw * sh * 3).map(|i| (i * 7 % 256) as u8).collect();
            for w in 1..=40 {
                for x in [0, 1, 5, sw - w] {
                    let win = [x, 2, w, 5];
                    let a = planes(&table, &src, sw, win);
                    assert_eq!(a, planes(&fast, &src, sw, win), "w={w} x={x}");
                    assert_eq!(a, planes(&div, &src, sw, win), "w={w} x={x}");
                    assert!(!a.contains(&nan), "w={w} x={x}");
                }
            }
        }
    }
}
