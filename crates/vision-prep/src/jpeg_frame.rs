//! What our own baseline-JPEG decode works from: one single-scan, Huffman-coded, 8-bit frame as
//! libjpeg's header reader left it (`jpeg::frame_of`), and the quantised DCT coefficients its
//! entropy decode gives (`jpeg_entropy`), which the reconstruction (`jpeg_idct`) turns into the
//! bytes libjpeg-turbo's decode gives (ISLOW IDCT, fancy upsampling, its YCbCr→RGB tables).
//!
//! Only what that path takes is described here; every other file (progressive, arithmetic,
//! multi-scan, CMYK, RGB-coded, missing tables, sampling ratios other than 1 and 2) stays on
//! libjpeg's own decode.

/// Colour space of the coded components, as libjpeg's header reader guessed it
/// (`jpeg_color_space`, from JFIF / Adobe markers and component ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Colour {
    /// One component, decoded to `L` (then replicated to RGB, as Pillow's `convert("RGB")`).
    Grey,
    /// Three components Y, Cb, Cr (frame order), converted to RGB with libjpeg's tables.
    YCbCr,
}

/// One Huffman table as the DHT segment codes it (libjpeg's `JHUFF_TBL`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HuffTable {
    /// `bits[l]`: how many codes have length `l` (1..=16); `bits[0]` is unused (0).
    pub bits: [u8; 17],
    /// The symbols in code order (as many as `bits` sums to, at most 256).
    pub values: Vec<u8>,
}

/// One component of the frame, in frame order (which our path requires to equal scan order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Component {
    /// Horizontal sampling factor (1..=4).
    pub h: usize,
    /// Vertical sampling factor (1..=4).
    pub v: usize,
    /// Quantisation table in natural (row-major, not zigzag) order.
    pub quant: [u16; 64],
    /// DC Huffman table of the scan for this component.
    pub dc: HuffTable,
    /// AC Huffman table of the scan for this component.
    pub ac: HuffTable,
    /// libjpeg's `downsampled_width`: `ceil(width · h / max_h)` samples per row.
    pub sampled_width: usize,
    /// libjpeg's `downsampled_height`: `ceil(height · v / max_v)` sample rows.
    pub sampled_height: usize,
    /// libjpeg's `width_in_blocks`: `ceil(sampled_width / 8)`.
    pub width_in_blocks: usize,
    /// libjpeg's `height_in_blocks`: `ceil(sampled_height / 8)`.
    pub height_in_blocks: usize,
    /// Blocks per row in [`Coefficients`]: for an interleaved scan (several components) the
    /// MCUs' columns, `mcus_x · h`; for a one-component scan `width_in_blocks`.
    pub stored_w: usize,
    /// Block rows in [`Coefficients`]: `mcus_y · v`, or `height_in_blocks` for one component.
    pub stored_h: usize,
}

/// One baseline frame with its single scan: geometry, tables and where the entropy-coded data is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Frame {
    /// Samples per line.
    pub width: usize,
    /// Lines.
    pub height: usize,
    /// Largest horizontal sampling factor.
    pub max_h: usize,
    /// Largest vertical sampling factor.
    pub max_v: usize,
    /// MCUs per MCU row of the scan: `ceil(width / (8·max_h))` when interleaved, else the one
    /// component's `width_in_blocks`.
    pub mcus_x: usize,
    /// MCU rows of the scan: `ceil(height / (8·max_v))` when interleaved, else the one
    /// component's `height_in_blocks`.
    pub mcus_y: usize,
    /// Components in frame (= scan) order: 1 (grey) or 3 (Y, Cb, Cr).
    pub components: Vec<Component>,
    /// MCUs between restart markers (DRI), 0 for none.
    pub restart_interval: usize,
    /// Coded colour space.
    pub colour: Colour,
    /// Byte offset in the file where the scan's entropy-coded data starts (just after SOS).
    pub scan_start: usize,
}

impl Frame {
    /// Whether the scan interleaves its components (MCUs of `h·v` blocks of each) or codes one
    /// component block by block.
    pub fn interleaved(&self) -> bool {
        self.components.len() > 1
    }

    /// Blocks in one MCU: `Σ h·v` when interleaved, else 1.
    pub fn blocks_per_mcu(&self) -> usize {
        if self.interleaved() {
            self.components.iter().map(|c| c.h * c.v).sum()
        } else {
            1
        }
    }
}

/// The quantised DCT coefficients of a [`Frame`], as libjpeg's `jpeg_read_coefficients` holds them:
/// per component, `stored_h` rows of `stored_w` blocks, each block 64 `i16` in natural order,
/// DC already the absolute value (the differences summed), not multiplied by the quantiser.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Coefficients {
    /// One plane per component, `stored_w · stored_h · 64` values.
    pub planes: Vec<Vec<i16>>,
}

impl Coefficients {
    /// All-zero planes for `frame`.
    pub fn zeroed(frame: &Frame) -> Self {
        Coefficients {
            planes: frame
                .components
                .iter()
                .map(|c| vec![0; c.stored_w * c.stored_h * 64])
                .collect(),
        }
    }

    /// Block `(bx, by)` of component `c`: 64 coefficients, natural order (the tests compare
    /// block by block).
    #[cfg(test)]
    pub fn block(&self, frame: &Frame, c: usize, bx: usize, by: usize) -> &[i16] {
        let w = frame.components[c].stored_w;
        let at = (by * w + bx) * 64;
        &self.planes[c][at..at + 64]
    }
}

#[cfg(test)]
mod tests {
    /// libjpeg's reading of every single-scan fixture JPEG gives planes of the stated sizes.
    #[test]
    fn libjpeg_frame_reads_the_fixture_jpegs() {
        let mut read = 0;
        for path in crate::jpeg::tests::fixture_jpegs() {
            let bytes = std::fs::read(&path).expect("fixture");
            let Ok((frame, coefs)) = crate::jpeg::libjpeg_frame(&bytes) else {
                continue;
            };
            assert_eq!(coefs.planes.len(), frame.components.len());
            for (c, plane) in frame.components.iter().zip(&coefs.planes) {
                assert_eq!(plane.len(), c.stored_w * c.stored_h * 64, "{path:?}");
                assert!(c.stored_w >= c.width_in_blocks && c.stored_h >= c.height_in_blocks);
            }
            read += 1;
        }
        assert!(read >= 5, "only {read} fixture JPEGs read");
    }
}
