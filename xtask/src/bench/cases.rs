//! The bench's cases (the anchors' shapes), their families and the analytic FLOP count.

use super::*;

/// A tower family, keyed as the PyTorch side keys it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `Gemma4VisionModel` + `Gemma4MultimodalEmbedder`.
    Gemma4,
    /// `Glm5NextVisionModel` (its merger is the projection).
    Glm5Next,
    /// `Step3p7VisionModel` + `multi_modal_projector`.
    Step3p7,
}

impl Family {
    pub(super) const ALL: [Family; 3] = [Family::Gemma4, Family::Glm5Next, Family::Step3p7];

    pub(super) fn key(self) -> &'static str {
        match self {
            Family::Gemma4 => "gemma4",
            Family::Glm5Next => "glm5_next",
            Family::Step3p7 => "step3p7",
        }
    }
}

/// A published row of the anchors' table (H200, 2026-11-29): ms and TFLOP/s, SDPA and compile.
#[derive(Debug, Clone, Copy)]
pub struct Anchor {
    pub(super) sdpa_ms: f64,
    /// The anchors' TFLOP/s: the tests' oracle for our FLOP count.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(super) sdpa_tflops: f64,
    pub(super) compile_ms: f64,
    #[cfg_attr(not(test), allow(dead_code))]
    pub(super) compile_tflops: f64,
}

/// One case of the anchors' table.
#[derive(Debug, Clone, Copy)]
pub struct CaseDef {
    /// The name `--cases` and the PyTorch side use.
    pub name: &'static str,
    /// Its family.
    pub family: Family,
    /// The table's label.
    pub label: &'static str,
    /// Images per batch.
    pub batch: usize,
    /// The full-size geometry.
    pub geometry: Geometry,
    /// The anchors' published numbers for it.
    pub anchor: Anchor,
}

/// The patch geometry of one image of a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Geometry {
    /// A patch grid, `gw` columns × `gh` rows (gemma4, glm5_next).
    Grid {
        /// Patch columns.
        gw: usize,
        /// Patch rows.
        gh: usize,
    },
    /// A square view of `side` pixels (step3p7).
    Side(usize),
}

pub(super) const fn anchor(
    sdpa_ms: f64,
    sdpa_tflops: f64,
    compile_ms: f64,
    compile_tflops: f64,
) -> Anchor {
    Anchor {
        sdpa_ms,
        sdpa_tflops,
        compile_ms,
        compile_tflops,
    }
}

/// The anchors' cases, in their table's order (`../shared/anchors/README.md`).
pub const CASES: [CaseDef; 8] = [
    CaseDef {
        name: "gemma4_b1",
        family: Family::Gemma4,
        label: "gemma4 42×57 (2394) b1",
        batch: 1,
        geometry: Geometry::Grid { gw: 42, gh: 57 },
        anchor: anchor(39.0, 85.0, 14.9, 223.0),
    },
    CaseDef {
        name: "gemma4_b8",
        family: Family::Gemma4,
        label: "gemma4 42×57 b8",
        batch: 8,
        geometry: Geometry::Grid { gw: 42, gh: 57 },
        anchor: anchor(138.4, 192.0, 86.4, 308.0),
    },
    CaseDef {
        name: "glm5_72_b1",
        family: Family::Glm5Next,
        label: "glm5_next 72×72 (5184) b1",
        batch: 1,
        geometry: Geometry::Grid { gw: 72, gh: 72 },
        anchor: anchor(34.7, 208.0, 20.9, 347.0),
    },
    CaseDef {
        name: "glm5_96x128_b1",
        family: Family::Glm5Next,
        label: "glm5_next 96×128 (12288) b1",
        batch: 1,
        geometry: Geometry::Grid { gw: 128, gh: 96 },
        anchor: anchor(90.5, 285.0, 59.4, 434.0),
    },
    CaseDef {
        name: "glm5_72_b8",
        family: Family::Glm5Next,
        label: "glm5_next 72×72 b8",
        batch: 8,
        geometry: Geometry::Grid { gw: 72, gh: 72 },
        anchor: anchor(233.9, 248.0, 137.3, 422.0),
    },
    CaseDef {
        name: "step_728_b1",
        family: Family::Step3p7,
        label: "step3p7 728 view (2704) b1",
        batch: 1,
        geometry: Geometry::Side(728),
        anchor: anchor(38.0, 306.0, 26.2, 445.0),
    },
    CaseDef {
        name: "step_504_b6",
        family: Family::Step3p7,
        label: "step3p7 504 tiles (1296) b6",
        batch: 6,
        geometry: Geometry::Side(504),
        anchor: anchor(92.4, 328.0, 62.6, 484.0),
    },
    CaseDef {
        name: "step_728_b8",
        family: Family::Step3p7,
        label: "step3p7 728 view b8",
        batch: 8,
        geometry: Geometry::Side(728),
        anchor: anchor(271.3, 343.0, 188.7, 493.0),
    },
];

/// Resolves `--cases` (names or families, comma-separated) to cases in table order.
pub fn select_cases(spec: Option<&str>) -> Result<Vec<&'static CaseDef>> {
    let Some(spec) = spec.filter(|s| !s.is_empty() && *s != "all") else {
        return Ok(CASES.iter().collect());
    };
    let mut keep = vec![false; CASES.len()];
    for tok in spec.split(',').map(str::trim) {
        let mut hit = false;
        for (i, c) in CASES.iter().enumerate() {
            if c.name == tok || c.family.key() == tok {
                keep[i] = true;
                hit = true;
            }
        }
        if !hit {
            bail!("unknown case or family `{tok}`\n{USAGE}");
        }
    }
    Ok(CASES
        .iter()
        .zip(keep)
        .filter(|(_, k)| *k)
        .map(|(c, _)| c)
        .collect())
}

// ---------------------------------------------------------------------------------------------
// FLOPs
// ---------------------------------------------------------------------------------------------

/// The dimensions the FLOP count reads, from a loaded config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dims {
    /// Gemma-4: attention width `heads·head_dim`, pooling `pool×pool`, embedder into `text`.
    Gemma {
        hidden: usize,
        width: usize,
        inter: usize,
        layers: usize,
        patch_dim: usize,
        pool: usize,
        text: usize,
    },
    /// GLM: `unit` = merge², merger `out → 2·merger_inner → out` (gate|up, down) after `out × out`.
    Glm {
        hidden: usize,
        inter: usize,
        layers: usize,
        patch_dim: usize,
        unit: usize,
        out: usize,
        merger_inner: usize,
    },
    /// Step-3.7: two 3×3 stride-2 downsamplers (H → 2H → 4H), projector `4H → text`.
    Step {
        hidden: usize,
        inter: usize,
        layers: usize,
        patch: usize,
        text: usize,
    },
}

/// Analytic FLOPs of one forward + projection over `batch` images of geometry `g` (the anchors'
/// formulas, `torch_anchor.py` counts the same): GEMMs and convs 2·m·n·k, attention 4·n²·width
/// per image (QKᵀ and PV).
pub fn flops(d: Dims, g: Geometry, batch: usize) -> Result<f64> {
    let b = batch as u128;
    let u = |v: usize| v as u128;
    let f = match (d, g) {
        (
            Dims::Gemma {
                hidden,
                width,
                inter,
                layers,
                patch_dim,
                pool,
                text,
            },
            Geometry::Grid { gw, gh },
        ) => {
            let (h, w, i, l, p, t) = (
                u(hidden),
                u(width),
                u(inter),
                u(layers),
                u(patch_dim),
                u(text),
            );
            let n = u(gw * gh);
            let rows = n / u(pool * pool);
            b * (2 * n * p * h
                + l * (2 * n * (3 * w * h + w * h) + 2 * n * 3 * h * i + 4 * n * n * w)
                + 2 * rows * h * t)
        }
        (
            Dims::Glm {
                hidden,
                inter,
                layers,
                patch_dim,
                unit,
                out,
                merger_inner,
            },
            Geometry::Grid { gw, gh },
        ) => {
            let (h, i, l, p, un, o, pi) = (
                u(hidden),
                u(inter),
                u(layers),
                u(patch_dim),
                u(unit),
                u(out),
                u(merger_inner),
            );
            let n = u(gw * gh);
            let t = n / un;
            b * (2 * n * p * h
                + l * (2 * n * 4 * h * h + 2 * n * 3 * h * i + 4 * n * n * h)
                + 2 * t * un * h * o
                + 2 * t * o * o
                + 2 * t * 3 * o * pi)
        }
        (
            Dims::Step {
                hidden,
                inter,
                layers,
                patch,
                text,
            },
            Geometry::Side(side),
        ) => {
            let (h, i, l, p, t) = (u(hidden), u(inter), u(layers), u(patch), u(text));
            let g = u(side) / p;
            let n = g * g;
            let g1 = (g - 1) / 2 + 1;
            let g2 = (g1 - 1) / 2 + 1;
            b * (2 * n * 3 * p * p * h
                + l * (2 * n * 4 * h * h + 2 * n * 2 * h * i + 4 * n * n * h)
                + 2 * g1 * g1 * 9 * h * 2 * h
                + 2 * g2 * g2 * 9 * 2 * h * 4 * h
                + 2 * g2 * g2 * 4 * h * t)
        }
        (d, g) => bail!("geometry {g:?} does not fit the family of {d:?}"),
    };
    Ok(f as f64)
}

/// The full-size dimensions of the anchors' configs (for the tests and the offline table).
pub fn anchor_dims(f: Family) -> Dims {
    match f {
        Family::Gemma4 => Dims::Gemma {
            hidden: 1152,
            width: 16 * 72,
            inter: 4304,
            layers: 27,
            patch_dim: 3 * 16 * 16,
            pool: 3,
            text: 5376,
        },
        Family::Glm5Next => Dims::Glm {
            hidden: 1024,
            inter: 4096,
            layers: 24,
            patch_dim: 3 * 2 * 14 * 14,
            unit: 4,
            out: 4096,
            merger_inner: 10240,
        },
        Family::Step3p7 => Dims::Step {
            hidden: 1536,
            inter: 8960,
            layers: 47,
            patch: 14,
            text: 4096,
        },
    }
}

pub(super) fn gemma_dims(c: &tower_gemma::GemmaConfig) -> Dims {
    Dims::Gemma {
        hidden: c.hidden,
        width: c.heads * c.head_dim,
        inter: c.intermediate,
        layers: c.layers,
        patch_dim: c.patch_dim(),
        pool: c.pool,
        text: c.text_hidden,
    }
}

pub(super) fn glm_dims(c: &tower_glm5::GlmConfig) -> Dims {
    Dims::Glm {
        hidden: c.hidden,
        inter: c.intermediate,
        layers: c.layers,
        patch_dim: c.patch_dim(),
        unit: c.merge_unit(),
        out: c.text_hidden,
        merger_inner: c.merger_inner,
    }
}

pub(super) fn step_dims(c: &tower_step::StepConfig) -> Dims {
    Dims::Step {
        hidden: c.hidden,
        inter: c.intermediate,
        layers: c.layers,
        patch: c.patch,
        text: c.text_hidden,
    }
}
