//! Each family's tower input for one image, as vision-prep produces it and the towers read it:
//! borrowed pixel data plus the shapes the processor's plan already knows, so nobody downstream
//! recovers a dimension from an element count.

/// One Gemma-4 image: what `Gemma4ImageProcessor` emits, without its padding rows.
#[derive(Debug, Clone, Copy)]
pub struct GemmaImage<'a> {
    /// `[P, 3·p²]` pixel patches in [0, 1], raster order, each row (ky, kx, c).
    pub patches: &'a [f32],
    /// `[P, 2]` patch positions (x, y); rows of (−1, −1) are padding and are dropped.
    pub positions: &'a [i64],
}

impl GemmaImage<'_> {
    /// Patches the tower runs: the positions that are not padding (−1, −1).
    pub fn num_patches(&self) -> usize {
        self.positions
            .chunks_exact(2)
            .filter(|p| p != &[-1, -1])
            .count()
    }
}

/// One GLM image (`glm5_next`, `glm_ocr`), or one video of `t` frame pairs.
#[derive(Debug, Clone, Copy)]
pub struct GlmImage<'a> {
    /// `[t·h·w, C·T·p²]` pixel rows, each (c, t, ky, kx), normalised; per frame, block-major
    /// over m×m blocks (block_row, block_col, in_row, in_col).
    pub patches: &'a [f32],
    /// The `image_grid_thw` row: temporal patches t, patch rows h, patch columns w.
    pub grid_thw: [usize; 3],
}

impl GlmImage<'_> {
    /// Patches the tower runs, `t·h·w` (saturating: an overflowing grid is refused by the tower).
    pub fn num_patches(&self) -> usize {
        let [t, h, w] = self.grid_thw;
        t.saturating_mul(h).saturating_mul(w)
    }
}

/// One square or rectangular Step-3.7 view (a crop tile or the global view).
#[derive(Debug, Clone, Copy)]
pub struct StepView<'a> {
    /// `[3, height, width]` pixel values.
    pub pixels: &'a [f32],
    /// Rows of pixels.
    pub height: usize,
    /// Columns of pixels.
    pub width: usize,
}

impl StepView<'_> {
    /// Patches of side `patch` the view holds (0 for a zero patch size).
    pub fn num_patches(&self, patch: usize) -> usize {
        match patch {
            0 => 0,
            p => (self.height / p).saturating_mul(self.width / p),
        }
    }
}

/// One Step-3.7 image: its crop tiles (possibly none) and its global view.
#[derive(Debug, Clone)]
pub struct StepImage<'a> {
    /// Crop tiles in the processor's (row-major) order.
    pub crops: Vec<StepView<'a>>,
    /// The global view.
    pub global: StepView<'a>,
    /// The processor's `patch_newline_masks` for this image, one flag per crop: a
    /// `<patch_newline>` follows that crop's rows in the prompt. Passed through untouched.
    pub newline_mask: Vec<bool>,
}

impl StepImage<'_> {
    /// Patches of side `patch` over every view, crops and global together.
    pub fn num_patches(&self, patch: usize) -> usize {
        self.crops
            .iter()
            .fold(self.global.num_patches(patch), |a, c| {
                a.saturating_add(c.num_patches(patch))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patch_counts_come_from_the_shapes() {
        let g = GemmaImage {
            patches: &[],
            positions: &[0, 0, 1, 0, -1, -1],
        };
        assert_eq!(g.num_patches(), 2);
        let glm = GlmImage {
            patches: &[],
            grid_thw: [2, 4, 6],
        };
        assert_eq!(glm.num_patches(), 48);
        let view = |side| StepView {
            pixels: &[],
            height: side,
            width: side,
        };
        let s = StepImage {
            crops: vec![view(28), view(28)],
            global: view(56),
            newline_mask: vec![true, false],
        };
        assert_eq!(s.num_patches(14), 16 + 4 + 4);
        assert_eq!(s.num_patches(0), 0);
    }
}
