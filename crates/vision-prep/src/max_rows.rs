//! The most embedding rows one image can give under a model's law and settings
//! ([`crate::Preprocessor::max_rows`]), for sizing encoder caches and memory profiles (vLLM's
//! `get_max_image_tokens`), with an image size that gives exactly that many.
//!
//! Every image the preprocessor prepares passes three gates: admission (`width·height ≤
//! limits.max_pixels`), the law (upstream refuses some sizes) and the output budget
//! (`max_output_bytes`). The maximum is over the sizes that pass all three. Each family first
//! bounds its rows from the law and the budget (an upper bound no admissible image can pass), then
//! looks for a size that reaches the bound among a small, bounded set of candidates derived from
//! the law's own discrete choices (grid sides, token counts, crop windows). A candidate that
//! reaches the bound proves it exact; the candidate is run through the same gates as a real image.

use crate::law::{self, Law, Step3p7Law, Step3p7Layout};
use crate::plan::{output_bytes_of, Geometry};
use crate::Preprocessor;

/// The most embedding rows one image can give, and how that is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxRows {
    /// The rows. Exact when [`MaxRows::reached_by`] is `Some`: no admissible image gives more,
    /// and that size gives exactly this many. Otherwise an upper bound (no admissible image gives
    /// more, but no size reaching it was found: settings far from the vendor's, or admission
    /// limits below the smallest image that reaches the law's maximum).
    pub rows: u64,
    /// A `(width, height)` whose plan has exactly [`MaxRows::rows`] rows and passes admission and
    /// the output budget.
    pub reached_by: Option<(u32, u32)>,
}

impl MaxRows {
    /// Whether [`MaxRows::rows`] is reached by an image (else it is an upper bound).
    pub fn is_exact(&self) -> bool {
        self.reached_by.is_some()
    }
}

/// glm46v `smart_resize` refuses aspect ratios over this (`absolute aspect ratio must be smaller
/// than 200`, image_processing_glm46v.py `smart_resize`).
const GLM46V_MAX_RATIO: u64 = law::GLM46V_MAX_ASPECT_RATIO as u64;

/// Largest `x` in `0..=hi` with `fits(x)`, for a `fits` that holds up to some point and fails
/// after it; `None` when `fits(0)` fails.
fn largest(hi: u64, fits: impl Fn(u64) -> bool) -> Option<u64> {
    if !fits(0) {
        return None;
    }
    let (mut lo, mut hi) = (0u64, hi);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    Some(lo)
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The best candidate so far: rows and size; among equal rows the one of fewer pixels (admitted
/// under the tightest limits), then the squarer one.
#[derive(Default)]
struct Best(Option<(u64, (u32, u32))>);

impl Best {
    fn offer(&mut self, rows: u64, size: (u32, u32)) {
        let px = |s: (u32, u32)| u64::from(s.0) * u64::from(s.1);
        // Aspect `long/short` compared by cross-multiplication.
        let squarer = |a: (u32, u32), b: (u32, u32)| {
            let (la, sa) = (u64::from(a.0.max(a.1)), u64::from(a.0.min(a.1)));
            let (lb, sb) = (u64::from(b.0.max(b.1)), u64::from(b.0.min(b.1)));
            la * sb < lb * sa
        };
        let better = match self.0 {
            None => true,
            Some((r, s)) => {
                rows > r
                    || (rows == r && px(size) < px(s))
                    || (rows == r && px(size) == px(s) && squarer(size, s))
            }
        };
        if better {
            self.0 = Some((rows, size));
        }
    }
}

impl Preprocessor {
    /// Rows of a `width × height` image if it passes admission, the law and the output budget.
    fn gated_rows(&self, width: u64, height: u64) -> Option<u64> {
        let (w, h) = (u32::try_from(width).ok()?, u32::try_from(height).ok()?);
        let plan = self.plan_size(w, h).ok()?;
        self.check_output(&plan).ok()?;
        Some(plan.rows)
    }

    fn offer(&self, best: &mut Best, width: u64, height: u64) {
        if let Some(rows) = self.gated_rows(width, height) {
            best.offer(rows, (width as u32, height as u32));
        }
    }

    /// Exact when the best candidate reaches `bound`, else the bound.
    fn settle(&self, bound: u64, best: Best) -> MaxRows {
        match best.0 {
            Some((rows, size)) if rows == bound => MaxRows {
                rows,
                reached_by: Some(size),
            },
            _ => MaxRows {
                rows: bound,
                reached_by: None,
            },
        }
    }

    /// The most embedding rows one image can give under this preprocessor's law, admission
    /// limits and output budget, with a size that reaches it (see [`MaxRows`]; the search is
    /// bounded and documented per family in `max_rows.rs`).
    pub fn max_rows(&self) -> MaxRows {
        let budget = self.settings.max_output_bytes;
        match &self.law {
            Law::Gemma4(l) => self.gemma4_max(l, budget),
            Law::Glm5Next(l) => self.glm5_next_max(l, budget),
            Law::Glm46V(l) => self.glm46v_max(l, budget),
            Law::Step3p7(l) => self.step3p7_max(l, budget),
        }
    }

    /// The most embedding rows one image can give ([`Preprocessor::max_rows`]`.rows`): exact for
    /// the vendor settings (an image of that many rows exists), otherwise an upper bound. Size an
    /// encoder cache or a memory profile with it.
    pub fn max_rows_per_image(&self) -> u64 {
        self.max_rows().rows
    }

    /// gemma4: `th·tw ≤ max_soft_tokens·k²·p²` is the law's own refusal, so rows
    /// `(th/kp)·(tw/kp) ≤ max_soft_tokens`. Sides `a = ⌊√(mst·h/w)⌋`, `b = ⌊√(mst·w/h)⌋`
    /// (`get_aspect_ratio_preserving_size`), so an image of aspect `h/w = a/b` with `a·b = mst`
    /// reaches it: the candidates are every divisor pair of `max_soft_tokens` at its smallest
    /// integer size, and the thin `(mst+1) × 1` (one row of `min(⌊w/h⌋, mst)` tokens).
    fn gemma4_max(&self, l: &law::Gemma4Law, budget: u64) -> MaxRows {
        let mst = u64::from(l.max_soft_tokens);
        let k = u64::from(l.pooling_kernel_size);
        let fits = |r: u64| {
            let g = Geometry::Gemma4 {
                gh: r.saturating_mul(k * k),
                gw: 1,
                pool: k,
            };
            output_bytes_of(&g, r) <= budget
        };
        let Some(bound) = largest(mst, fits) else {
            return self.settle(0, Best::default());
        };
        let mut best = Best::default();
        for a in (1..=mst).filter(|a| mst % a == 0) {
            let b = mst / a;
            let g = gcd(a, b);
            self.offer(&mut best, b / g, a / g);
        }
        self.offer(&mut best, mst + 1, 1);
        self.offer(&mut best, 1, mst + 1);
        self.settle(bound, best)
    }

    /// glm5_next: `smart_resize` keeps `t·ah·aw ≤ max_image_tokens·t·f²` (`f = p·merge·expand`),
    /// so rows `(ah/f)(aw/f)·expand² ≤ max_image_tokens·expand²`. A `1 × (f·j − f + 1)` image
    /// aligns to `f × f·j` and gives `j` tokens for every `j` from `min_image_tokens` to
    /// `max_image_tokens` (no aspect limit in this law), so the bound is exact, the output budget
    /// included.
    fn glm5_next_max(&self, l: &law::Glm5NextLaw, budget: u64) -> MaxRows {
        let (m, e) = (u64::from(l.merge_size), u64::from(l.patch_expand_factor));
        let f = u64::from(l.patch_size) * m * e;
        let fits = |j: u64| {
            let rows = j.saturating_mul(e * e);
            let g = Geometry::Glm {
                content: (0, 0),
                gh: rows.saturating_mul(m * m),
                gw: 1,
                merge: m,
            };
            output_bytes_of(&g, rows) <= budget
        };
        let Some(j) = largest(l.max_image_tokens, fits) else {
            return self.settle(0, Best::default());
        };
        let mut best = Best::default();
        if j >= l.min_image_tokens && j > 0 {
            let long = (f * j).saturating_sub(f - 1);
            self.offer(&mut best, 1, long);
            self.offer(&mut best, long, 1);
        }
        self.settle(j * e * e, best)
    }

    /// glm46v (GLM-OCR): `smart_resize` rounds each side to `f = p·merge`; within the pixel
    /// budget `t·h̄·w̄ ≤ longest_edge`, so rows `≤ ⌊longest_edge/(t·f²)⌋`. Two branches can pass
    /// that: the downscale clamps a side to `f` (then rows `≤ √(200·longest_edge/t)/f`, aspect
    /// ≤ 200) and the upscale of small images (rows `< shortest_edge/(t·f²) + √(shortest_edge/t)
    /// ·(√200 + 1/√200)/f + 1`); the bound is the largest of the three (the first, at the vendor
    /// settings). Candidates: every grid side `a ≤ √n` with `b = ⌊n/a⌋ ≤ 200·a` at `(f·b, f·a)`,
    /// for the bound `n` — exact when one of them reaches it.
    fn glm46v_max(&self, l: &law::Glm46VLaw, budget: u64) -> MaxRows {
        let m = u64::from(l.merge_size);
        let f = u64::from(l.patch_size) * m;
        let t = u64::from(l.temporal_patch_size);
        let per_token = t * f * f;
        let within = l.longest_edge / per_token;
        let ratio = law::GLM46V_MAX_ASPECT_RATIO;
        let clamped = ((ratio * l.longest_edge as f64 / t as f64).sqrt() / f as f64).ceil() as u64;
        let upscaled = l.shortest_edge / per_token
            + ((l.shortest_edge as f64 / t as f64).sqrt() * (ratio.sqrt() + 1.0 / ratio.sqrt())
                / f as f64)
                .ceil() as u64
            + 2;
        let law_bound = within.max(clamped).max(upscaled);
        let fits = |r: u64| {
            let g = Geometry::Glm {
                content: (0, 0),
                gh: r.saturating_mul(m * m),
                gw: 1,
                merge: m,
            };
            output_bytes_of(&g, r) <= budget
        };
        let Some(bound) = largest(law_bound, fits) else {
            return self.settle(0, Best::default());
        };
        let n = bound.min(within);
        let mut best = Best::default();
        let mut a = 1u64;
        while a * a <= n {
            let b = n / a;
            if b <= GLM46V_MAX_RATIO * a {
                self.offer(&mut best, f * b, f * a);
            }
            a += 1;
        }
        self.settle(bound, best)
    }

    /// step3p7: rows `= crops·(504/56)² + (728/56)²`, rising with the crop count, which the
    /// law takes from the view `_plan_patches` works on ([`law::step3p7_view`]: squared when
    /// thin, long side capped at `max_image_size`). The search walks every view the admission
    /// limits can produce, by its short side `s` (the crop window, when under `patch_size`):
    ///
    /// * uncapped views `s ≤ l ≤ max_image_size`, `s·l ≤ max_pixels` (and `l ≤ 4s` when
    ///   `s < 32`, else the source is squared): on each stretch of `l` where the window rule is
    ///   fixed (cut at the global side, `1.5·s` and `4·s`) the crop count rises with `l`, so a
    ///   binary search finds the longest `l` whose crops fit the output budget;
    /// * squared thin sources `t × 1` (view `t × t`), the same way, and capped ones;
    /// * capped sources (long side over `max_image_size`): the view's long side is `int(L·(M/L))`,
    ///   `M` or `M − 1`, and its short side any `s`; both are bounded, and a size giving the best
    ///   is looked for among the smallest sources of that short side (a few short sides `S` from
    ///   `s + 1` or 32, the first long sides `L` that give `s`).
    ///
    /// The bound is the best crop count over all those views within the budget; the result is
    /// exact when a source reaching it is found. With the default 2 GiB output budget the budget
    /// binds: a thin capped view (`s` = 5 at the vendor sizes) gives more crops than any square.
    fn step3p7_max(&self, l: &Step3p7Law, budget: u64) -> MaxRows {
        let (per_crop, global) = law::step3p7_rows(l);
        let (side, crop_side) = (u64::from(l.image_size), u64::from(l.patch_size));
        let m = u64::from(l.max_image_size);
        let pixels = self.settings.limits.max_pixels;
        let rows = |k: u64| k.saturating_mul(per_crop).saturating_add(global);
        let fits = |k: u64| {
            let g = Geometry::Step3p7 {
                layout: Step3p7Layout {
                    global: (0, 0),
                    crop: (0, 0),
                    window: 0,
                    nx: k,
                    ny: 1,
                    square_pad: false,
                },
                global_side: side,
                crop_side,
                rows_per_crop: per_crop,
                rows_global: global,
                newline_mask: Vec::new(),
            };
            output_bytes_of(&g, rows(k)) <= budget
        };
        let Some(kmax) = largest((m + 1).saturating_mul(m + 1), fits) else {
            return self.settle(0, Best::default());
        };
        // Crops of a source through the whole law, `None` if the law refuses it.
        let crops_of = |w: u64, h: u64| -> Option<u64> {
            let (w, h) = (u32::try_from(w).ok()?, u32::try_from(h).ok()?);
            let lay = law::step3p7_layout(l, h, w).ok()?;
            Some(lay.nx * lay.ny)
        };
        let mut s = StepSearch {
            kmax,
            bound: None,
            best: None,
        };
        // Uncapped, not squared: sources `l × s` that are their own view.
        for short in 1..=m.min(pixels.isqrt()) {
            let mut hi = m.min(pixels / short);
            if short < law::STEP3P7_EXTREME_SHORT_SIDE {
                hi = hi.min(4 * short);
            }
            let cuts = [side, short * 3 / 2, 4 * short, hi];
            s.stretches(
                short,
                hi,
                &cuts,
                |long| crops_of(long, short),
                |long| (long, short),
            );
        }
        // Squared thin sources `t × 1` (view `t × t`).
        let top = m.min(pixels);
        s.stretches(5, top, &[side, top], |t| crops_of(t, 1), |t| (t, 1));
        if m < pixels {
            for view in [m, m - 1] {
                s.bound(crops_of_view(l, view, view));
            }
            for t in (m + 1..=m + 16).filter(|&t| t <= pixels) {
                s.offer(crops_of(t, 1), (t, 1));
            }
        }
        // Capped sources `L × S`, `L > M`: view `(M or M − 1) × s`, `S ≥ s + 1` (and `S ≥ 32`
        // when `M ≥ 128`: a shorter side is then squared).
        let min_short = if m >= 4 * law::STEP3P7_EXTREME_SHORT_SIDE {
            law::STEP3P7_EXTREME_SHORT_SIDE
        } else {
            1
        };
        for short in 1..=m {
            let least = (m + 1).saturating_mul((short + 1).max(min_short));
            if least > pixels {
                break;
            }
            for long in [m, m - 1].into_iter().filter(|&v| v >= short) {
                let k = crops_of_view(l, long, short);
                s.bound(k);
                let Some(k) = k.filter(|&k| k <= kmax) else {
                    continue;
                };
                if s.best.is_some_and(|(b, _)| b >= k) {
                    continue;
                }
                'found: for big_s in (short + 1).max(min_short)..(short + 1).max(min_short) + 4 {
                    let first = (big_s * m / (short + 1) + 1).max(m + 1).max(big_s);
                    for big_l in first.saturating_sub(2).max(m + 1)..first + 24 {
                        if big_l.saturating_mul(big_s) > pixels {
                            break;
                        }
                        let (vw, vh, squared) = law::step3p7_view(
                            l,
                            u32::try_from(big_s).unwrap_or(0),
                            u32::try_from(big_l).unwrap_or(0),
                        );
                        if !squared && (vw, vh) == (long, short) {
                            s.offer(Some(k), (big_l, big_s));
                            break 'found;
                        }
                    }
                }
            }
        }
        let bound = s.bound.map_or(0, rows);
        let mut best = Best::default();
        if let Some((_, (w, h))) = s.best {
            // The witness goes through the same gates as a real image.
            self.offer(&mut best, w, h);
        }
        self.settle(bound, best)
    }
}

/// Crops of a view (both sides ≥ 1) under the window law.
fn crops_of_view(l: &Step3p7Law, w: u64, h: u64) -> Option<u64> {
    if w.min(h) == 0 {
        return None;
    }
    let (_, _, nx, ny) = law::step3p7_tiles(l, w, h);
    Some(nx * ny)
}

/// The step3p7 search state: the budget in crops, the best crop count any possible view gives
/// within it (the bound), and the best one a source was found for.
struct StepSearch {
    kmax: u64,
    bound: Option<u64>,
    best: Option<(u64, (u64, u64))>,
}

impl StepSearch {
    fn bound(&mut self, k: Option<u64>) {
        if let Some(k) = k.filter(|&k| k <= self.kmax) {
            self.bound = Some(self.bound.map_or(k, |b| b.max(k)));
        }
    }

    /// A source with `k` crops: raises the bound and, when better, the best.
    fn offer(&mut self, k: Option<u64>, source: (u64, u64)) {
        self.bound(k);
        if let Some(k) = k.filter(|&k| k <= self.kmax) {
            if self.best.is_none_or(|(b, _)| k > b) {
                self.best = Some((k, source));
            }
        }
    }

    /// Over `x ∈ [lo, hi]` cut after each of `cuts` into stretches on which `crops(x)` rises
    /// with `x`: the largest `x` of each stretch whose crops fit the budget, as a source.
    fn stretches(
        &mut self,
        lo: u64,
        hi: u64,
        cuts: &[u64],
        crops: impl Fn(u64) -> Option<u64>,
        source: impl Fn(u64) -> (u64, u64),
    ) {
        let mut ends: Vec<u64> = cuts
            .iter()
            .copied()
            .filter(|&c| c >= lo && c < hi)
            .collect();
        ends.push(hi);
        ends.sort_unstable();
        ends.dedup();
        let mut start = lo;
        for end in ends {
            if start > end {
                continue;
            }
            let fits = |x: u64| crops(x).is_some_and(|k| k <= self.kmax);
            if fits(start) {
                // The largest x in [start, end] that fits (crops rise with x on the stretch).
                let off = largest(end - start, |d| fits(start + d)).unwrap_or(0);
                let x = start + off;
                self.offer(crops(x), source(x));
            }
            start = end + 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::law::{Gemma4Law, Glm46VLaw, Glm5NextLaw};
    use crate::plan::tests::fixture_preprocessors;
    use crate::{config, Family, ModelConfigs, PrepSettings};
    use serde_json::Value;

    fn oracle() -> Value {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fixtures/prep/max_rows.json");
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        serde_json::from_str(&text).expect("max_rows.json")
    }

    /// The oracle entry of a fixture preprocessor (the clipped and HF-layout repositories share
    /// their sibling's processor config).
    fn oracle_name(name: &str) -> &str {
        match name {
            "models/gemma4_clipped" | "plans.json gemma4_70" => "models/gemma4",
            "models/step3p7_hf" => "models/step3p7",
            "plans.json glm5_next" => "models/glm5_next",
            other => other,
        }
    }

    /// Rows of a size through every gate a real image passes, or why not.
    fn gated(pre: &Preprocessor, w: u32, h: u32) -> Result<u64, String> {
        let plan = pre.plan_size(w, h).map_err(|e| e.to_string())?;
        pre.check_output(&plan).map_err(|e| e.to_string())?;
        Ok(plan.rows)
    }

    /// (a) Every fixture configuration's maximum is exact, and its size plans exactly that many
    /// rows within admission and the output budget; (b) upstream on that size gives the same rows,
    /// and upstream on every size of the oracle sweep (neighbours, scaled copies, extreme aspect
    /// ratios, every step3p7 window) never gives more — or our preprocessor refuses that size.
    #[test]
    fn max_rows_is_reached_and_upstream_never_passes_it() {
        let table = oracle();
        let lifted = PrepSettings {
            max_output_bytes: u64::MAX,
            ..Default::default()
        };
        let mut checked = 0;
        for ((name, pre), (_, free)) in fixture_preprocessors(PrepSettings::default())
            .into_iter()
            .zip(fixture_preprocessors(lifted))
        {
            let entry = &table["configs"][oracle_name(&name)];
            assert!(entry.is_object(), "{name}: no oracle entry");
            let witnesses: Vec<(u32, u32)> = entry["witness"]
                .as_array()
                .expect("witness")
                .iter()
                .map(|x| (x[0].as_u64().unwrap() as u32, x[1].as_u64().unwrap() as u32))
                .collect();
            let upstream = |w: u32, h: u32| -> Option<Option<u64>> {
                entry["rows"]
                    .as_array()
                    .expect("rows")
                    .iter()
                    .find_map(|r| {
                        (r[0].as_u64() == Some(u64::from(w)) && r[1].as_u64() == Some(u64::from(h)))
                            .then(|| r[2].as_u64())
                    })
            };
            for (pre, what) in [(&pre, "default"), (&free, "budget lifted")] {
                let max = pre.max_rows();
                let ctx = format!("{name} ({what}): {max:?}");
                let (w, h) = max.reached_by.unwrap_or_else(|| panic!("{ctx}: not exact"));
                assert_eq!(gated(pre, w, h), Ok(max.rows), "{ctx}");
                assert!(witnesses.contains(&(w, h)), "{ctx}: size not in the oracle");
                assert_eq!(upstream(w, h), Some(Some(max.rows)), "{ctx}: upstream");
                assert_eq!(pre.max_rows_per_image(), max.rows);
            }
            let max = pre.max_rows().rows;
            let mut admitted_max = 0;
            for r in entry["rows"].as_array().expect("rows") {
                let (w, h) = (r[0].as_u64().unwrap() as u32, r[1].as_u64().unwrap() as u32);
                let ours = gated(&pre, w, h);
                let ctx = format!("{name} {w}x{h}");
                match r[2].as_u64() {
                    None => assert!(pre.plan_size(w, h).is_err(), "{ctx}: upstream refused"),
                    Some(up) if up > max => {
                        assert!(
                            ours.is_err(),
                            "{ctx}: upstream {up} rows over our {max}, admitted"
                        );
                    }
                    Some(up) => {
                        if let Ok(rows) = ours {
                            assert_eq!(rows, up, "{ctx}");
                            admitted_max = admitted_max.max(up);
                        }
                        // Without the budget the plan is upstream's whatever its size.
                        assert_eq!(free.plan_size(w, h).map(|p| p.rows).ok(), Some(up), "{ctx}");
                    }
                }
                checked += 1;
            }
            assert_eq!(admitted_max, max, "{name}: the sweep's admitted maximum");
        }
        assert!(checked > 3000, "only {checked} sizes");
    }

    /// Upstream's placeholder mask (`get_placeholder_mask` on the expanded ids) equals `is_embed`.
    #[test]
    fn is_embed_equals_upstream_placeholder_mask() {
        let table = oracle();
        for (name, pre) in fixture_preprocessors(PrepSettings::default()) {
            let entry = &table["configs"][oracle_name(&name)];
            for m in entry["masks"].as_array().expect("masks") {
                let (w, h) = (
                    m["width"].as_u64().unwrap() as u32,
                    m["height"].as_u64().unwrap() as u32,
                );
                let plan = pre.plan_size(w, h).expect("plan");
                let mut ours: Vec<(bool, u64)> = Vec::new();
                for b in plan.is_embed() {
                    match ours.last_mut() {
                        Some((v, n)) if *v == b => *n += 1,
                        _ => ours.push((b, 1)),
                    }
                }
                let theirs: Vec<(bool, u64)> = m["embeds"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| (r[0].as_bool().unwrap(), r[1].as_u64().unwrap()))
                    .collect();
                assert_eq!(ours, theirs, "{name} {w}x{h}");
                assert_eq!(m["rows"].as_u64(), Some(plan.rows), "{name} {w}x{h}");
            }
        }
    }

    fn pre(law: Law, family: Family, settings: PrepSettings) -> Preprocessor {
        let tokens = config::tokens_for(&law, &ModelConfigs::default());
        Preprocessor::from_law(law, tokens, family, settings)
    }

    /// Every `w × h` with `w·h ≤ max_pixels`, through the gates: the true maximum, by brute force.
    fn brute(p: &Preprocessor) -> u64 {
        let px = p.settings.limits.max_pixels;
        let mut best = 0;
        for w in 1..=px {
            for h in 1..=px / w {
                if let Ok(r) = gated(p, w as u32, h as u32) {
                    best = best.max(r);
                }
            }
        }
        best
    }

    /// The search against every admissible size, on small laws where that is countable: the
    /// exact answers equal the brute-force maximum, the bounds are never below it.
    #[test]
    fn search_equals_brute_force_on_small_laws() {
        let step = |m: u32| {
            Law::Step3p7(Step3p7Law {
                image_size: 84,
                patch_size: 56,
                max_image_size: m,
                vision_patch_size: 14,
                downsampler_stride: 1,
                ..Default::default()
            })
        };
        let laws = [
            (
                Law::Gemma4(Gemma4Law {
                    max_soft_tokens: 70,
                    ..Default::default()
                }),
                Family::Gemma4,
            ),
            (
                Law::Glm5Next(Glm5NextLaw {
                    max_image_tokens: 40,
                    ..Default::default()
                }),
                Family::Glm5Next,
            ),
            (
                Law::Glm46V(Glm46VLaw {
                    shortest_edge: 2 * 784 * 4,
                    longest_edge: 2 * 784 * 30,
                    ..Default::default()
                }),
                Family::GlmOcr,
            ),
            (step(150), Family::Step3p7),
            (step(100), Family::Step3p7),
        ];
        for (law, family) in laws {
            for (pixels, budget) in [
                (30_000, u64::MAX),
                (30_000, 2_000_000),
                (4_000, u64::MAX),
                (60, u64::MAX),
            ] {
                let mut settings = PrepSettings::default();
                settings.limits.max_pixels = pixels;
                settings.max_output_bytes = budget;
                let p = pre(law.clone(), family, settings);
                let got = p.max_rows();
                let want = brute(&p);
                let ctx = format!("{family:?} pixels {pixels} budget {budget}: {got:?}");
                if let Some((w, h)) = got.reached_by {
                    assert_eq!(gated(&p, w, h), Ok(got.rows), "{ctx}");
                    assert_eq!(got.rows, want, "{ctx}");
                } else {
                    assert!(
                        got.rows >= want,
                        "{ctx}: bound under the brute force {want}"
                    );
                }
            }
        }
    }

    /// Settings that leave nothing to prepare give 0 rows, not a panic.
    #[test]
    fn nothing_admissible_is_zero_rows() {
        for (law, family) in [
            (Law::Gemma4(Gemma4Law::default()), Family::Gemma4),
            (Law::Glm5Next(Glm5NextLaw::default()), Family::Glm5Next),
            (Law::Glm46V(Glm46VLaw::default()), Family::GlmOcr),
            (Law::Step3p7(Step3p7Law::default()), Family::Step3p7),
        ] {
            let mut settings = PrepSettings {
                max_output_bytes: 0,
                ..Default::default()
            };
            let got = pre(law.clone(), family, settings).max_rows();
            assert_eq!(
                got,
                MaxRows {
                    rows: 0,
                    reached_by: None
                },
                "{family:?}"
            );
            settings.max_output_bytes = u64::MAX;
            settings.limits.max_pixels = 0;
            let got = pre(law, family, settings).max_rows();
            assert!(got.reached_by.is_none(), "{family:?}: {got:?}");
        }
    }
}
