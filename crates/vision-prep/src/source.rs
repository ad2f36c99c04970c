//! Admission (header only), capped decode, and the upstream RGB conversion.

use std::io::Cursor;

use base64::Engine;
use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader, Limits};

use crate::error::{PrepError, Result};
pub use crate::rgb::RgbImage;

/// Default decode budget: 50 megapixels.
pub const DEFAULT_MAX_PIXELS: u64 = 50_000_000;
/// Default cap on the encoded length of a `data:` URI: 20 MB.
pub const DEFAULT_MAX_DATA_URI_BYTES: usize = 20_000_000;

/// Limits applied before and during decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionLimits {
    /// Largest `width × height` admitted (default [`DEFAULT_MAX_PIXELS`]).
    pub max_pixels: u64,
    /// Largest encoded `data:` URI, in bytes, before base64 decoding (default [`DEFAULT_MAX_DATA_URI_BYTES`]).
    pub max_data_uri_bytes: usize,
}

impl Default for AdmissionLimits {
    fn default() -> Self {
        AdmissionLimits {
            max_pixels: DEFAULT_MAX_PIXELS,
            max_data_uri_bytes: DEFAULT_MAX_DATA_URI_BYTES,
        }
    }
}

/// Where the image bytes come from.
#[derive(Debug, Clone, Copy)]
pub enum ImageSource<'a> {
    /// Raw file bytes (JPEG, PNG, WebP, GIF, BMP).
    Bytes(&'a [u8]),
    /// A `data:[<mime>];base64,<payload>` URI.
    DataUri(&'a str),
}

impl<'a> ImageSource<'a> {
    /// Classify a URI string: `data:` becomes [`ImageSource::DataUri`]; any other scheme
    /// (`http:`, `https:`, `file:`, …) is refused with [`PrepError::SchemeRefused`].
    /// Anything without a scheme is refused too (read the file yourself and pass [`ImageSource::Bytes`]).
    pub fn parse_uri(uri: &'a str) -> Result<ImageSource<'a>> {
        let trimmed = uri.trim_start();
        match trimmed.find(':') {
            Some(i) if trimmed[..i].eq_ignore_ascii_case("data") => {
                Ok(ImageSource::DataUri(trimmed))
            }
            Some(i)
                if i > 0
                    && trimmed[..i]
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')) =>
            {
                Err(PrepError::SchemeRefused(trimmed[..i].to_ascii_lowercase()))
            }
            _ => Err(PrepError::SchemeRefused("(none)".into())),
        }
    }

    /// The raw image bytes: borrowed, or base64-decoded from the data URI (after the length cap).
    pub fn bytes(&self, limits: &AdmissionLimits) -> Result<std::borrow::Cow<'a, [u8]>> {
        match *self {
            ImageSource::Bytes(b) => Ok(std::borrow::Cow::Borrowed(b)),
            ImageSource::DataUri(uri) => decode_data_uri(uri, limits).map(std::borrow::Cow::Owned),
        }
    }
}

fn decode_data_uri(uri: &str, limits: &AdmissionLimits) -> Result<Vec<u8>> {
    if uri.len() > limits.max_data_uri_bytes {
        return Err(PrepError::DataUriTooLarge {
            len: uri.len(),
            cap: limits.max_data_uri_bytes,
        });
    }
    let rest = uri
        .get(..5)
        .filter(|p| p.eq_ignore_ascii_case("data:"))
        .map(|_| &uri[5..])
        .ok_or_else(|| PrepError::BadDataUri("does not start with `data:`".into()))?;
    let comma = rest
        .find(',')
        .ok_or_else(|| PrepError::BadDataUri("no `,` before the payload".into()))?;
    let meta = &rest[..comma];
    if !meta
        .split(';')
        .any(|p| p.trim().eq_ignore_ascii_case("base64"))
    {
        return Err(PrepError::BadDataUri(
            "only `;base64` payloads are accepted".into(),
        ));
    }
    let payload: String = rest[comma + 1..]
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    base64::engine::general_purpose::STANDARD
        .decode(payload.as_bytes())
        .map_err(|e| PrepError::BadDataUri(format!("payload is not base64: {e}")))
}

/// Formats admitted for decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceFormat {
    /// JPEG (baseline, progressive, grayscale, CMYK).
    Jpeg,
    /// PNG (all bit depths and colour types).
    Png,
    /// WebP (lossy, lossless, alpha).
    WebP,
    /// GIF (first frame).
    Gif,
    /// BMP.
    Bmp,
}

impl SourceFormat {
    fn image_format(self) -> ImageFormat {
        match self {
            SourceFormat::Jpeg => ImageFormat::Jpeg,
            SourceFormat::Png => ImageFormat::Png,
            SourceFormat::WebP => ImageFormat::WebP,
            SourceFormat::Gif => ImageFormat::Gif,
            SourceFormat::Bmp => ImageFormat::Bmp,
        }
    }

    /// Lower-case name (`"jpeg"`, …).
    pub fn name(self) -> &'static str {
        match self {
            SourceFormat::Jpeg => "jpeg",
            SourceFormat::Png => "png",
            SourceFormat::WebP => "webp",
            SourceFormat::Gif => "gif",
            SourceFormat::Bmp => "bmp",
        }
    }
}

/// What the header says, read before any pixel is decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Sniffed format.
    pub format: SourceFormat,
    /// Declared width.
    pub width: u32,
    /// Declared height.
    pub height: u32,
}

/// Read only the header: sniff the format from the magic bytes, read the dimensions, and refuse
/// non-images, unsupported formats, zero sizes and anything over `limits.max_pixels`.
pub fn admit(bytes: &[u8], limits: &AdmissionLimits) -> Result<Header> {
    let format = match image::guess_format(bytes) {
        Ok(ImageFormat::Jpeg) => SourceFormat::Jpeg,
        Ok(ImageFormat::Png) => SourceFormat::Png,
        Ok(ImageFormat::WebP) => SourceFormat::WebP,
        Ok(ImageFormat::Gif) => SourceFormat::Gif,
        Ok(ImageFormat::Bmp) => SourceFormat::Bmp,
        Ok(other) => return Err(PrepError::UnsupportedFormat(format!("{other:?}"))),
        Err(_) => {
            return Err(PrepError::NotAnImage(format!(
                "{} bytes without a known image signature",
                bytes.len()
            )))
        }
    };
    let (width, height) = if format == SourceFormat::Jpeg {
        let h = crate::jpeg::read_header(bytes)?;
        (h.width, h.height)
    } else {
        let mut reader = ImageReader::with_format(Cursor::new(bytes), format.image_format());
        // Header parsing itself must not allocate much: cap it at a small budget.
        let mut lim = Limits::default();
        lim.max_alloc = Some(64 << 20);
        reader.limits(lim);
        reader.into_dimensions().map_err(|e| PrepError::Decode {
            format: format.name().into(),
            reason: format!("header: {e}"),
        })?
    };
    if width == 0 || height == 0 {
        return Err(PrepError::ZeroSized { width, height });
    }
    let pixels = u64::from(width) * u64::from(height);
    if pixels > limits.max_pixels {
        return Err(PrepError::OverBudget {
            width,
            height,
            pixels,
            budget: limits.max_pixels,
        });
    }
    Ok(Header {
        format,
        width,
        height,
    })
}

/// Decode an admitted image with the decoder capped to the admitted dimensions and an allocation
/// limit, then convert to RGB exactly as the upstream processor does for a PIL image
/// (`transformers.image_transforms.convert_to_rgb`): alpha is composited onto white with PIL's
/// integer `alpha_composite`; PIL's mode conversions for 16-bit data are reproduced (see [`to_rgb`]).
/// The EXIF orientation is not applied (upstream leaves PIL images as opened). JPEG goes through
/// libjpeg-turbo exactly as Pillow decodes it (`jpeg` module); 8-bit RGB PNG through the
/// `pngfast` module where it takes the file whole; the rest through `image`.
pub fn decode(bytes: &[u8], header: &Header) -> Result<RgbImage> {
    decode_in(bytes, header, crate::pages::Scratch::none(), 1)
}

/// [`decode`] with the RGB buffer from `scratch` (JPEG, and formats the decoder gives as RGB8);
/// a baseline JPEG of a megapixel or more is decoded in up to `bands` row bands at once on the
/// rayon pool (the same bytes: `jpeg::decode_banded`).
pub(crate) fn decode_in(
    bytes: &[u8],
    header: &Header,
    scratch: &crate::pages::Scratch,
    bands: usize,
) -> Result<RgbImage> {
    let fmt = header.format.name();
    let max_alloc = max_alloc(header);
    if header.format == SourceFormat::Jpeg {
        return crate::jpeg::decode_banded(
            bytes,
            header.width,
            header.height,
            max_alloc,
            scratch,
            bands,
        );
    }
    if header.format == SourceFormat::Png {
        if let Some(img) = crate::pngfast::decode_rgb8(bytes, header.width, header.height, scratch)
        {
            return Ok(img);
        }
    }
    let mut reader = ImageReader::with_format(Cursor::new(bytes), header.format.image_format());
    let mut lim = Limits::default();
    lim.max_image_width = Some(header.width);
    lim.max_image_height = Some(header.height);
    lim.max_alloc = Some(max_alloc);
    reader.limits(lim.clone());
    let err = |e: image::ImageError| PrepError::Decode {
        format: fmt.into(),
        reason: e.to_string(),
    };
    // What `ImageReader::decode` does, with the output buffer ours when it is already RGB8.
    let mut decoder = reader.into_decoder().map_err(err)?;
    let (w, h) = decoder.dimensions();
    if (w, h) != (header.width, header.height) {
        return Err(PrepError::DimensionMismatch {
            width: header.width,
            height: header.height,
            got_width: w,
            got_height: h,
        });
    }
    let total = decoder.total_bytes();
    lim.reserve(total).map_err(err)?;
    decoder.set_limits(lim).map_err(err)?;
    if decoder.color_type() == image::ColorType::Rgb8 && total == u64::from(w) * u64::from(h) * 3 {
        // `read_image` writes every byte, so a scratch buffer will do.
        let mut data = scratch.take(total as usize);
        decoder.read_image(&mut data).map_err(err)?;
        return Ok(RgbImage {
            width: w as usize,
            height: h as usize,
            data,
        });
    }
    to_rgb(DynamicImage::from_decoder(decoder).map_err(err)?)
}

/// [`decode_in`], then the vendor resize to `out_w × out_h` with `filter` (`resize_rgb_in`, rows
/// over the pool when `parallel`): the same bytes, but a JPEG decoded in bands is resized while
/// it decodes (`jpeg::decode_resized`). The decoded image's buffer goes back to `scratch`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn decode_resized_in(
    bytes: &[u8],
    header: &Header,
    scratch: &crate::pages::Scratch,
    bands: usize,
    out: (usize, usize),
    filter: crate::resize::Filter,
    parallel: bool,
) -> Result<RgbImage> {
    if header.format == SourceFormat::Jpeg {
        return crate::jpeg::decode_resized(
            bytes,
            header.width,
            header.height,
            max_alloc(header),
            scratch,
            bands,
            out,
            filter,
            parallel,
        );
    }
    let rgb = decode_in(bytes, header, scratch, bands)?;
    let data = crate::resize::resize_rgb_in(
        &rgb.data, rgb.width, rgb.height, out.0, out.1, filter, parallel, scratch,
    );
    scratch.give(rgb.data);
    Ok(RgbImage {
        width: out.0,
        height: out.1,
        data,
    })
}

/// The allocation cap of a decode: the largest decoded layout is RGBA16 (8 bytes a pixel), with
/// room for the decoder's scratch.
fn max_alloc(header: &Header) -> u64 {
    let pixels = u64::from(header.width) * u64::from(header.height);
    pixels.saturating_mul(16).saturating_add(64 << 20)
}

/// PIL `alpha_composite` of an RGBA pixel over opaque white, then `.convert("RGB")`
/// (Pillow src/libImaging/AlphaComposite.c: 7 extra precision bits, rounded divisions by 255).
#[inline]
pub fn composite_on_white(v: u8, a: u8) -> u8 {
    if a == 0 {
        return 255;
    }
    const PRECISION_BITS: u32 = 7;
    let (sa, dv, da) = (u32::from(a), 255u32, 255u32);
    let blend = da * (255 - sa);
    let outa255 = sa * 255 + blend;
    let coef1 = sa * 255 * 255 * (1 << PRECISION_BITS) / outa255;
    let coef2 = 255 * (1 << PRECISION_BITS) - coef1;
    let tmp = u32::from(v) * coef1 + dv * coef2 + (0x80 << PRECISION_BITS);
    ((((tmp >> 8) + tmp) >> 8) >> PRECISION_BITS) as u8
}

/// Convert a decoded image to RGB u8 the way `convert_to_rgb(PIL image)` does.
///
/// - L / RGB: replicated / as is. LA / RGBA (incl. palette or grey/RGB with `tRNS`, which the
///   decoder expands to alpha as PIL's `convert("RGBA")` does): composited onto white.
/// - 16-bit RGB(A) and LA: PIL keeps the most significant byte (`RGB;16B` raw modes).
/// - 16-bit grey: PIL opens it as `I;16` and `convert("RGB")` clips each value to 255.
pub fn to_rgb(img: DynamicImage) -> Result<RgbImage> {
    let (w, h) = (img.width() as usize, img.height() as usize);
    let data: Vec<u8> = match img {
        DynamicImage::ImageRgb8(b) => b.into_raw(),
        DynamicImage::ImageLuma8(b) => b.into_raw().iter().flat_map(|&v| [v, v, v]).collect(),
        DynamicImage::ImageLumaA8(b) => b
            .into_raw()
            .chunks_exact(2)
            .flat_map(|p| {
                let v = composite_on_white(p[0], p[1]);
                [v, v, v]
            })
            .collect(),
        DynamicImage::ImageRgba8(b) => b
            .into_raw()
            .chunks_exact(4)
            .flat_map(|p| {
                [
                    composite_on_white(p[0], p[3]),
                    composite_on_white(p[1], p[3]),
                    composite_on_white(p[2], p[3]),
                ]
            })
            .collect(),
        DynamicImage::ImageLuma16(b) => b
            .into_raw()
            .iter()
            .flat_map(|&v| {
                let v = v.min(255) as u8;
                [v, v, v]
            })
            .collect(),
        DynamicImage::ImageLumaA16(b) => b
            .into_raw()
            .chunks_exact(2)
            .flat_map(|p| {
                let v = composite_on_white((p[0] >> 8) as u8, (p[1] >> 8) as u8);
                [v, v, v]
            })
            .collect(),
        DynamicImage::ImageRgb16(b) => b.into_raw().iter().map(|&v| (v >> 8) as u8).collect(),
        DynamicImage::ImageRgba16(b) => b
            .into_raw()
            .chunks_exact(4)
            .flat_map(|p| {
                let a = (p[3] >> 8) as u8;
                [
                    composite_on_white((p[0] >> 8) as u8, a),
                    composite_on_white((p[1] >> 8) as u8, a),
                    composite_on_white((p[2] >> 8) as u8, a),
                ]
            })
            .collect(),
        other => {
            return Err(PrepError::UnsupportedPixelLayout(format!(
                "{:?}",
                other.color()
            )))
        }
    };
    Ok(RgbImage {
        width: w,
        height: h,
        data,
    })
}

/// Admit, decode and convert in one call.
pub fn load(source: ImageSource<'_>, limits: &AdmissionLimits) -> Result<(Header, RgbImage)> {
    let bytes = source.bytes(limits)?;
    let header = admit(&bytes, limits)?;
    let rgb = decode(&bytes, &header)?;
    Ok((header, rgb))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/prep/decode")
    }

    /// Decode + RGB conversion vs `convert_to_rgb(PIL.Image.open(f))` (prep_decode.py).
    /// Bound: lossless formats (PNG in every mode, lossless WebP, GIF, BMP) and JPEG (libjpeg-turbo,
    /// as Pillow) EXACT; lossy WebP measured (image-webp vs libwebp; exact on this fixture today).
    #[test]
    fn decode_matches_pil_convert_to_rgb() {
        let text = std::fs::read_to_string(dir().join("cases.json")).expect("cases.json");
        let table: serde_json::Value = serde_json::from_str(&text).expect("json");
        let mut bad = Vec::new();
        for case in table["cases"].as_array().expect("cases") {
            let file = case["file"].as_str().expect("file");
            let bytes = std::fs::read(dir().join(file)).expect("read");
            let exp = image::open(dir().join(case["expected"].as_str().expect("exp")))
                .expect("png")
                .to_rgb8();
            let (h, got) = match load(ImageSource::Bytes(&bytes), &AdmissionLimits::default()) {
                Ok(x) => x,
                Err(e) => {
                    bad.push(format!("{file}: {e}"));
                    continue;
                }
            };
            assert_eq!((h.width, h.height), exp.dimensions(), "{file}");
            let e = exp.into_raw();
            let exact = got.data.iter().zip(&e).filter(|(a, b)| a == b).count();
            let maxd = got
                .data
                .iter()
                .zip(&e)
                .map(|(a, b)| a.abs_diff(*b))
                .max()
                .unwrap_or(0);
            eprintln!(
                "decode {file:24} ({}): {:.3}% exact, max diff {maxd}",
                case["pil_mode"],
                100.0 * exact as f64 / e.len() as f64
            );
            if (case["lossless"] == true || file.ends_with(".jpg")) && maxd != 0 {
                bad.push(format!("{file}: max diff {maxd}, must be exact"));
            }
        }
        assert!(bad.is_empty(), "{bad:#?}");
    }

    #[test]
    fn composite_on_white_edges() {
        // Full opacity keeps the value, full transparency gives white (PIL alpha_composite).
        for v in 0..=255u8 {
            assert_eq!(composite_on_white(v, 255), v);
            assert_eq!(composite_on_white(v, 0), 255);
        }
    }
}
