//! Our own entropy decode of a baseline JPEG scan into [`crate::jpeg_frame::Coefficients`]: the
//! quantised coefficients libjpeg's `jpeg_read_coefficients` gives, exactly, or a refusal
//! ([`Declined`]) after which the caller decodes the file with libjpeg.
//!
//! What is taken: SOF0/SOF1 (8-bit, Huffman, sequential), one scan of all frame components in
//! frame order (1 or 3), sampling factors 1..=4 with at most 10 blocks per MCU, restart
//! intervals or none. What is declined is everything libjpeg would have to repair or warn about
//! in the scan data (an invalid Huffman code, a coefficient run past 63, the data of a segment
//! ending inside an MCU, restart markers out of order, anything but EOI after the scan, a DC
//! outside `i16`, a Huffman table libjpeg's `jpeg_make_d_derived_tbl` refuses): libjpeg's own
//! decode then gives its (lenient) answer.
//!
//! The decode works on the entropy-coded segment unstuffed (`FF 00` → `FF`) into a buffer, with a
//! 64-bit bit reader kept in registers and, per Huffman table, a 10-bit lookahead table whose
//! entries give the code length and symbol, or, where the code and its extra bits fit in the 10
//! bits, the coefficient value itself (libjpeg's Figure F.16 decode for longer codes); the AC
//! decode looks up 11 bits at a time in a table that gives up to two such coefficients.
//!
//! The parallel decode ([`decode_parallel`]), in three parallel passes:
//! 1. the data unstuffed into one buffer (the byte ranges counted, then copied);
//! 2. every block's start bit, MCU position and DC found, without its AC coefficients (12-bit
//!    skip tables pass over several AC symbols at once). With restart markers the intervals,
//!    which start byte-aligned with the DC predictions reset, are decoded from their known
//!    starts. Without, the data is split into chunks by bit position: worker 0 decodes from the
//!    true start, every other worker speculatively from its chunk's first bit as if a block of
//!    MCU position 0 started there (and again one bit past any invalid block it meets),
//!    recording each block's (start bit, MCU position) and DC difference. Each worker then
//!    decodes on past its chunk's end until a block start equals one recorded by the worker
//!    owning that bit: the same state at the same bit decodes the same from there on, so that
//!    worker's records from there are proven. Following these sync points from worker 0 gives
//!    the scan's blocks; their DC differences are summed per component in that order;
//! 3. bands of MCU rows (about equal bits each) decoded again from their first block's proven
//!    start, straight into the planes, checking that each block ends where the next was found
//!    to start. (Restart intervals of whole MCU rows skip pass 2: their groups are the bands.)
//!
//! Whatever is not proven that way declines: the parallel decode gives the sequential decode's
//! answer, coefficients or refusal.

use rayon::prelude::*;

use crate::jpeg_frame::{Coefficients, Colour, Component, Frame, HuffTable};

/// Why our decode declines (the caller then decodes the whole file with libjpeg, which also
/// reports errors).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Declined(pub &'static str);

/// Zigzag position → natural (row-major) position (libjpeg's `jpeg_natural_order`).
const NATURAL: [u8; 64] = [
    0, 1, 8, 16, 9, 2, 3, 10, 17, 24, 32, 25, 18, 11, 4, 5, 12, 19, 26, 33, 40, 48, 41, 34, 27, 20,
    13, 6, 7, 14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51, 58, 59,
    52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63,
];

/// libjpeg's `JPEG_MAX_DIMENSION`.
const MAX_DIMENSION: usize = 65500;

/// libjpeg's `D_MAX_BLOCKS_IN_MCU`.
const MAX_BLOCKS_IN_MCU: usize = 10;

/// Zero bytes after the unstuffed data, so the bit reader's 8-byte loads never leave it.
const PAD: usize = 8;

// ---------------------------------------------------------------------------------------------
// Header
// ---------------------------------------------------------------------------------------------

/// A frame component as SOF declares it.
#[derive(Clone, Copy)]
struct SofComponent {
    id: u8,
    h: usize,
    v: usize,
    tq: usize,
}

fn be16(b: &[u8], at: usize) -> Option<usize> {
    Some(usize::from(u16::from_be_bytes([
        *b.get(at)?,
        *b.get(at + 1)?,
    ])))
}

/// Our reading of the markers up to the first SOS: SOF0 or SOF1 (8-bit, Huffman, sequential)
/// only; DQT (8- and 16-bit entries, zigzag → natural order), DHT (later definitions replace
/// earlier), DRI, SOS (components must be all frame components in frame order; Ss=0, Se=63,
/// Ah=Al=0), APPn/COM skipped. `None` for anything else (progressive, arithmetic, missing tables,
/// sampling factors outside 1..=4, component count not 1 or 3, more than 10 blocks per MCU, a
/// Huffman table libjpeg refuses, ...). `colour` is Grey for 1 component and YCbCr for 3 (the
/// caller overrides it with libjpeg's guess). `scan_start` is the offset just after the SOS
/// segment.
pub(crate) fn parse_frame(bytes: &[u8]) -> Option<Frame> {
    if bytes.get(..2)? != [0xFF, 0xD8] {
        return None;
    }
    let mut i = 2usize;
    let mut quant: [Option<[u16; 64]>; 4] = [None; 4];
    let mut dc: [Option<HuffTable>; 4] = Default::default();
    let mut ac: [Option<HuffTable>; 4] = Default::default();
    let mut restart_interval = 0usize;
    let mut sof: Option<(usize, usize, Vec<SofComponent>)> = None;
    loop {
        // libjpeg's next_marker: skip garbage, then fill bytes; FF 00 is skipped as garbage.
        let code = loop {
            while *bytes.get(i)? != 0xFF {
                i += 1;
            }
            while *bytes.get(i)? == 0xFF {
                i += 1;
            }
            let c = *bytes.get(i)?;
            i += 1;
            if c != 0 {
                break c;
            }
        };
        let len = be16(bytes, i)?;
        if len < 2 {
            return None;
        }
        let body = bytes.get(i + 2..i + len)?;
        match code {
            0xC0 | 0xC1 => {
                if sof.is_some() || body.len() < 6 || body[0] != 8 {
                    return None;
                }
                let height = be16(body, 1)?;
                let width = be16(body, 3)?;
                let n = usize::from(body[5]);
                if width == 0 || height == 0 || width > MAX_DIMENSION || height > MAX_DIMENSION {
                    return None;
                }
                if !matches!(n, 1 | 3) || body.len() != 6 + 3 * n {
                    return None;
                }
                let mut comps = Vec::with_capacity(n);
                for k in 0..n {
                    let c = &body[6 + 3 * k..9 + 3 * k];
                    let comp = SofComponent {
                        id: c[0],
                        h: usize::from(c[1] >> 4),
                        v: usize::from(c[1] & 15),
                        tq: usize::from(c[2]),
                    };
                    if !(1..=4).contains(&comp.h) || !(1..=4).contains(&comp.v) || comp.tq > 3 {
                        return None;
                    }
                    if comps.iter().any(|o: &SofComponent| o.id == comp.id) {
                        return None;
                    }
                    comps.push(comp);
                }
                sof = Some((width, height, comps));
            }
            0xC4 => {
                let mut rest = body;
                while rest.len() > 16 {
                    let index = rest[0];
                    let mut bits = [0u8; 17];
                    bits[1..].copy_from_slice(&rest[1..17]);
                    let count: usize = bits.iter().map(|&b| usize::from(b)).sum();
                    rest = &rest[17..];
                    if count > 256 || count > rest.len() {
                        return None;
                    }
                    let table = HuffTable {
                        bits,
                        values: rest[..count].to_vec(),
                    };
                    rest = &rest[count..];
                    match index {
                        0..=3 => dc[usize::from(index)] = Some(table),
                        0x10..=0x13 => ac[usize::from(index - 0x10)] = Some(table),
                        _ => return None,
                    }
                }
                if !rest.is_empty() {
                    return None;
                }
            }
            0xDB => {
                let mut rest = body;
                while let Some((&pq, tail)) = rest.split_first() {
                    let (wide, n) = (pq >> 4 != 0, usize::from(pq & 15));
                    let size = if wide { 128 } else { 64 };
                    if n > 3 || tail.len() < size {
                        return None;
                    }
                    let mut table = [0u16; 64];
                    for (k, &nat) in NATURAL.iter().enumerate() {
                        table[usize::from(nat)] = if wide {
                            u16::from_be_bytes([tail[2 * k], tail[2 * k + 1]])
                        } else {
                            u16::from(tail[k])
                        };
                    }
                    quant[n] = Some(table);
                    rest = &tail[size..];
                }
            }
            0xDD => {
                if body.len() != 2 {
                    return None;
                }
                restart_interval = be16(body, 0)?;
            }
            0xDA => {
                let (width, height, comps) = sof?;
                let n = usize::from(*body.first()?);
                if body.len() != 4 + 2 * n || n != comps.len() {
                    return None;
                }
                let mut tables = Vec::with_capacity(n);
                for (k, comp) in comps.iter().enumerate() {
                    let (cc, t) = (body[1 + 2 * k], body[2 + 2 * k]);
                    let (td, ta) = (usize::from(t >> 4), usize::from(t & 15));
                    if cc != comp.id || td > 3 || ta > 3 {
                        return None;
                    }
                    let (d, a) = (dc[td].clone()?, ac[ta].clone()?);
                    // The table checks libjpeg makes when the scan starts.
                    Table::new(&d, true).ok()?;
                    Table::new(&a, false).ok()?;
                    tables.push((d, a));
                }
                if body[1 + 2 * n..] != [0, 63, 0] {
                    return None;
                }
                let frame = build_frame(
                    width,
                    height,
                    &comps,
                    &quant,
                    tables,
                    restart_interval,
                    i + len,
                )?;
                return Some(frame);
            }
            0xE0..=0xEF | 0xFE => {}
            _ => return None,
        }
        i += len;
    }
}

/// The frame's geometry as libjpeg's jdinput.c computes it (`initial_setup`, `per_scan_setup`).
fn build_frame(
    width: usize,
    height: usize,
    comps: &[SofComponent],
    quant: &[Option<[u16; 64]>; 4],
    tables: Vec<(HuffTable, HuffTable)>,
    restart_interval: usize,
    scan_start: usize,
) -> Option<Frame> {
    let max_h = comps.iter().map(|c| c.h).max()?;
    let max_v = comps.iter().map(|c| c.v).max()?;
    let interleaved = comps.len() > 1;
    if interleaved && comps.iter().map(|c| c.h * c.v).sum::<usize>() > MAX_BLOCKS_IN_MCU {
        return None;
    }
    let (mut mcus_x, mut mcus_y) = (width.div_ceil(8 * max_h), height.div_ceil(8 * max_v));
    let mut components = Vec::with_capacity(comps.len());
    for (c, (dc, ac)) in comps.iter().zip(tables) {
        let width_in_blocks = (width * c.h).div_ceil(8 * max_h);
        let height_in_blocks = (height * c.v).div_ceil(8 * max_v);
        let (stored_w, stored_h) = if interleaved {
            (mcus_x * c.h, mcus_y * c.v)
        } else {
            (width_in_blocks, height_in_blocks)
        };
        components.push(Component {
            h: c.h,
            v: c.v,
            quant: quant[c.tq]?,
            dc,
            ac,
            sampled_width: (width * c.h).div_ceil(max_h),
            sampled_height: (height * c.v).div_ceil(max_v),
            width_in_blocks,
            height_in_blocks,
            stored_w,
            stored_h,
        });
    }
    if !interleaved {
        mcus_x = components[0].width_in_blocks;
        mcus_y = components[0].height_in_blocks;
    }
    Some(Frame {
        width,
        height,
        max_h,
        max_v,
        mcus_x,
        mcus_y,
        colour: if interleaved {
            Colour::YCbCr
        } else {
            Colour::Grey
        },
        components,
        restart_interval,
        scan_start,
    })
}

// ---------------------------------------------------------------------------------------------
// Huffman tables
// ---------------------------------------------------------------------------------------------

/// Bits of the lookahead table.
const FAST_BITS: u32 = 10;
const FAST_SIZE: usize = 1 << FAST_BITS;
/// Lookahead entry flag: the entry's bits 16..32 are the (extended) value, and its length
/// counts the code and the value's bits.
const COMBINED: u32 = 1 << 6;

/// Bits of the AC pair tables.
const PAIR_BITS: u32 = 11;
const PAIR_SIZE: usize = 1 << PAIR_BITS;

/// One derived Huffman table.
///
/// A lookahead entry: bits 0..6 the bits to consume (0: the code is longer than [`FAST_BITS`] or
/// invalid), bit 6 [`COMBINED`], bits 8..16 the symbol, bits 16..32 the value when combined.
struct Table {
    fast: Box<[u32; FAST_SIZE]>,
    /// AC tables: per [`PAIR_BITS`]-bit string, the lookahead entry of its first symbol in the
    /// low 32 bits; where that one is combined, a second coefficient: bits 32..38 the bits both
    /// take, 38..45 the second's zigzag distance from the first, 48..64 its value. Where the
    /// next symbol is not a combined entry that fits, the second is the first again (distance
    /// 0, the first's bits and value), so that the decode need not branch on it.
    pairs: Option<Box<[u64; PAIR_SIZE]>>,
    /// libjpeg's `maxcode` (-1: no code of that length; `[17]` a sentinel).
    maxcode: [i32; 18],
    /// libjpeg's `valoffset`.
    valoffset: [i32; 18],
    values: [u8; 256],
}

/// libjpeg's `HUFF_EXTEND`: the `s`-bit value `v` as a signed difference (`s` in 1..=15).
#[inline(always)]
fn extend(v: u32, s: u32) -> i32 {
    let v = v as i32;
    if v < 1 << (s - 1) {
        v - (1 << s) + 1
    } else {
        v
    }
}

impl Table {
    /// libjpeg's `jpeg_make_d_derived_tbl`, with its refusals.
    fn new(t: &HuffTable, is_dc: bool) -> Result<Table, Declined> {
        const BAD: Declined = Declined("bad Huffman table");
        // Figure C.1: code lengths in symbol order.
        let mut sizes = Vec::with_capacity(256);
        for l in 1..=16u32 {
            let n = usize::from(t.bits[l as usize]);
            if sizes.len() + n > 256 {
                return Err(BAD);
            }
            sizes.extend(std::iter::repeat_n(l, n));
        }
        let mut values = [0u8; 256];
        for (v, &x) in values.iter_mut().zip(&t.values) {
            *v = x;
        }
        // Figure C.2: the codes; none may be all ones.
        let mut codes = vec![0u32; sizes.len()];
        let (mut code, mut p) = (0u32, 0usize);
        let mut si = sizes.first().copied().unwrap_or(0);
        while p < sizes.len() {
            while p < sizes.len() && sizes[p] == si {
                codes[p] = code;
                p += 1;
                code += 1;
            }
            if code >= 1 << si {
                return Err(BAD);
            }
            code <<= 1;
            si += 1;
        }
        // Figure F.15.
        let mut maxcode = [-1i32; 18];
        let mut valoffset = [0i32; 18];
        let mut p = 0usize;
        for l in 1..=16 {
            let n = usize::from(t.bits[l]);
            if n != 0 {
                valoffset[l] = p as i32 - codes[p] as i32;
                p += n;
                maxcode[l] = codes[p - 1] as i32;
            }
        }
        maxcode[17] = 0xFFFFF;
        if is_dc && values[..sizes.len()].iter().any(|&s| s > 15) {
            return Err(BAD);
        }
        let mut fast = Box::new([0u32; FAST_SIZE]);
        for (p, (&l, &code)) in sizes.iter().zip(&codes).enumerate() {
            if l > FAST_BITS {
                break;
            }
            let sym = u32::from(values[p]);
            let shift = FAST_BITS - l;
            let s = sym & 15;
            let combine = if is_dc {
                s <= shift
            } else {
                s != 0 && s <= shift
            };
            for fill in 0..1u32 << shift {
                let entry = if combine {
                    let value = if s == 0 {
                        0
                    } else {
                        extend(fill >> (shift - s), s)
                    };
                    (l + s) | COMBINED | (sym << 8) | (u32::from(value as i16 as u16) << 16)
                } else {
                    l | (sym << 8)
                };
                fast[((code << shift) | fill) as usize] = entry;
            }
        }
        let pairs = (!is_dc).then(|| {
            let mut pairs = Box::new([0u64; PAIR_SIZE]);
            for (i, slot) in pairs.iter_mut().enumerate() {
                let first = fast[i >> (PAIR_BITS - FAST_BITS)];
                let len1 = first & 63;
                *slot = u64::from(first);
                if first & COMBINED == 0 {
                    continue;
                }
                let rest = ((i as u32) << len1) & (PAIR_SIZE as u32 - 1);
                let second = fast[(rest >> (PAIR_BITS - FAST_BITS)) as usize];
                let len2 = second & 63;
                let (bits, dist, value) = if second & COMBINED != 0 && len1 + len2 <= PAIR_BITS {
                    (len1 + len2, 1 + ((second >> 12) & 15), second >> 16)
                } else {
                    (len1, 0, first >> 16)
                };
                *slot |= u64::from(bits) << 32 | u64::from(dist) << 38 | u64::from(value) << 48;
            }
            pairs
        });
        Ok(Table {
            fast,
            pairs,
            maxcode,
            valoffset,
            values,
        })
    }

    /// A code longer than [`FAST_BITS`] (Figure F.16 from there): `(symbol, length)` for the
    /// 16 bits `peek`, or `None` for an invalid code.
    #[cold]
    #[inline(never)]
    fn slow(&self, peek: u32) -> Option<(u32, u32)> {
        for l in FAST_BITS as usize + 1..=16 {
            let code = (peek >> (16 - l)) as i32;
            if code <= self.maxcode[l] {
                let at = (code + self.valoffset[l]) as usize & 255;
                return Some((u32::from(self.values[at]), l as u32));
            }
        }
        None
    }
}

// ---------------------------------------------------------------------------------------------
// Bit reader over unstuffed data
// ---------------------------------------------------------------------------------------------

/// MSB-first bit reader over unstuffed entropy-coded data followed by [`PAD`] zero bytes; past
/// the data it reads zeros (the callers check the position against the data's end). `Copy`, so
/// the hot loops work on a copy in registers.
#[derive(Clone, Copy)]
struct Bits<'a> {
    data: &'a [u8],
    /// Next byte to load.
    pos: usize,
    /// Bits not yet consumed, left-aligned; below them zeros or the correct next bits.
    buf: u64,
    /// Valid bits in `buf` (at most 63).
    nbits: u32,
}

impl<'a> Bits<'a> {
    /// A reader at bit `bit` of `data`.
    fn new(data: &'a [u8], bit: usize) -> Self {
        let mut b = Bits {
            data,
            pos: bit / 8,
            buf: 0,
            nbits: 0,
        };
        b.refill();
        b.consume((bit % 8) as u32);
        b
    }

    /// At least 56 bits in the buffer.
    #[inline(always)]
    fn refill(&mut self) {
        if let Some(w) = self.data.get(self.pos..).and_then(|s| s.first_chunk::<8>()) {
            self.buf |= u64::from_be_bytes(*w) >> self.nbits;
            self.pos += (63 - self.nbits as usize) >> 3;
            self.nbits |= 56;
        } else {
            *self = self.refill_slow();
        }
    }

    /// Near the data's end: byte by byte, zeros past it. By value, so that the caller's reader
    /// need not live in memory.
    #[cold]
    #[inline(never)]
    fn refill_slow(mut self) -> Self {
        while self.nbits <= 56 {
            let b = self.data.get(self.pos).copied().unwrap_or(0);
            self.buf |= u64::from(b) << (56 - self.nbits);
            self.pos += 1;
            self.nbits += 8;
        }
        self
    }

    /// The bit the next read starts at.
    #[inline(always)]
    fn position(&self) -> usize {
        self.pos * 8 - self.nbits as usize
    }

    /// The next `n` bits (1..=32), not consumed.
    #[inline(always)]
    fn peek(&self, n: u32) -> u32 {
        (self.buf >> (64 - n)) as u32
    }

    #[inline(always)]
    fn consume(&mut self, n: u32) {
        self.buf <<= n;
        self.nbits -= n;
    }
}

// ---------------------------------------------------------------------------------------------
// Block decode
// ---------------------------------------------------------------------------------------------

/// Where a block's AC coefficients go.
trait Sink {
    /// Coefficient at zigzag position `k` (1..=63) is `v`.
    fn put(&mut self, k: usize, v: i16);
}

/// Straight into a zeroed block of 64, natural order.
struct Dense<'a>(&'a mut [i16; 64]);

impl Sink for Dense<'_> {
    #[inline(always)]
    fn put(&mut self, k: usize, v: i16) {
        self.0[usize::from(NATURAL[k & 63])] = v;
    }
}

/// Nowhere: the decode only finds where blocks start.
struct Discard;

impl Sink for Discard {
    #[inline(always)]
    fn put(&mut self, _: usize, _: i16) {}
}

const BAD_CODE: Declined = Declined("invalid Huffman code");
const PAST_63: Declined = Declined("coefficient run past 63");

/// One block (F.2.2.1, F.2.2.2): its AC coefficients into `out`, its DC difference returned.
/// A ZRL that runs past coefficient 63 ends the block, as in libjpeg; a coefficient past 63 is
/// refused.
#[inline(always)]
fn decode_block<S: Sink>(
    reader: &mut Bits,
    dc: &Table,
    ac: &Table,
    out: &mut S,
) -> Result<i32, Declined> {
    // On a copy, which the optimiser keeps in registers.
    let mut br = *reader;
    let diff = decode_dc(&mut br, dc);
    let mut k = 1usize;
    let mut done = diff.map(|_| ());
    let Some(pairs) = &ac.pairs else {
        return Err(BAD_FRAME);
    };
    while done.is_ok() && k < 64 {
        // A symbol and its value take at most 31 bits.
        if br.nbits < 31 {
            br.refill();
        }
        let e = pairs[br.peek(PAIR_BITS) as usize & (PAIR_SIZE - 1)];
        let first = e as u32;
        if first & COMBINED != 0 {
            let k1 = k + ((first >> 12) & 15) as usize;
            let k2 = k1 + ((e >> 38) & 127) as usize;
            if k2 <= 63 {
                br.consume(((e >> 32) & 63) as u32);
                out.put(k1, (first >> 16) as u16 as i16);
                out.put(k2, (e >> 48) as u16 as i16);
                k = k2 + 1;
                continue;
            }
            // The block ends between the two, or the first is past 63.
            if k1 > 63 {
                done = Err(PAST_63);
                break;
            }
            br.consume(first & 63);
            out.put(k1, (first >> 16) as u16 as i16);
            k = k1 + 1;
            continue;
        }
        match ac_entry(&mut br, ac, k, out, first) {
            Ok(next) => k = next,
            Err(e) => done = Err(e),
        }
    }
    *reader = br;
    done.and(diff)
}

/// A block as [`decode_block`] decodes it, but only to find where it ends: runs of AC symbols
/// that fit in [`SKIP_BITS`] are passed over with one lookup in `skip`.
#[inline(always)]
fn skip_block(
    reader: &mut Bits,
    dc: &Table,
    ac: &Table,
    skip: &[u32; SKIP_SIZE],
) -> Result<i32, Declined> {
    let mut br = *reader;
    let diff = decode_dc(&mut br, dc);
    let mut k = 1usize;
    let mut done = diff.map(|_| ());
    while done.is_ok() && k < 64 {
        if br.nbits < 31 {
            br.refill();
        }
        let e = skip[br.peek(SKIP_BITS) as usize & (SKIP_SIZE - 1)];
        let kadv = ((e >> 5) & 127) as usize;
        let eob = e & SKIP_EOB != 0;
        if e & 31 != 0 && (k + kadv < 64 || (!eob && k + kadv == 64)) {
            br.consume(e & 31);
            k = if eob { 64 } else { k + kadv };
            continue;
        }
        match ac_symbol(&mut br, ac, k, &mut Discard) {
            Ok(next) => k = next,
            Err(e) => done = Err(e),
        }
    }
    *reader = br;
    done.and(diff)
}

/// The DC difference of a block.
#[inline(always)]
fn decode_dc(br: &mut Bits, dc: &Table) -> Result<i32, Declined> {
    br.refill();
    let e = dc.fast[br.peek(FAST_BITS) as usize & (FAST_SIZE - 1)];
    if e & COMBINED != 0 {
        br.consume(e & 63);
        return Ok((e as i32) >> 16);
    }
    let (sym, len) = if e & 63 != 0 {
        ((e >> 8) & 255, e & 63)
    } else {
        dc.slow(br.peek(16)).ok_or(BAD_CODE)?
    };
    br.consume(len);
    let s = sym & 15;
    Ok(if s == 0 {
        0
    } else {
        let v = br.peek(s);
        br.consume(s);
        extend(v, s)
    })
}

/// One AC symbol at zigzag position `k` (1..=63), its coefficient into `out`: the next
/// position, 64 or more where the block ends.
#[inline(always)]
fn ac_symbol<S: Sink>(br: &mut Bits, ac: &Table, k: usize, out: &mut S) -> Result<usize, Declined> {
    // A symbol and its value take at most 31 bits.
    if br.nbits < 31 {
        br.refill();
    }
    let e = ac.fast[br.peek(FAST_BITS) as usize & (FAST_SIZE - 1)];
    ac_entry(br, ac, k, out, e)
}

/// [`ac_symbol`] with the symbol's lookahead entry `e` in hand.
#[inline(always)]
fn ac_entry<S: Sink>(
    br: &mut Bits,
    ac: &Table,
    k: usize,
    out: &mut S,
    e: u32,
) -> Result<usize, Declined> {
    if e & COMBINED != 0 {
        let k = k + ((e >> 12) & 15) as usize;
        if k > 63 {
            return Err(PAST_63);
        }
        br.consume(e & 63);
        out.put(k, (e >> 16) as u16 as i16);
        return Ok(k + 1);
    }
    let (sym, len) = if e & 63 != 0 {
        ((e >> 8) & 255, e & 63)
    } else {
        ac.slow(br.peek(16)).ok_or(BAD_CODE)?
    };
    br.consume(len);
    let (r, s) = (sym >> 4, sym & 15);
    if s == 0 {
        return Ok(if r == 15 { k + 16 } else { 64 });
    }
    let k = k + r as usize;
    if k > 63 {
        return Err(PAST_63);
    }
    let v = br.peek(s);
    br.consume(s);
    out.put(k, extend(v, s) as i16);
    Ok(k + 1)
}

/// Bits of the skip tables.
const SKIP_BITS: u32 = 12;
const SKIP_SIZE: usize = 1 << SKIP_BITS;
/// Skip entry flag: the run ends with an end-of-block.
const SKIP_EOB: u32 = 1 << 12;

/// For each [`SKIP_BITS`]-bit string, the longest run of whole AC symbols (codes of at most
/// [`FAST_BITS`] bits with their values) it starts with, ending at the first end-of-block, and
/// not advancing past 64 positions: bits 0..5 the bits they take (0: none fits), bits 5..12 the
/// zigzag positions they advance (the end-of-block's not counted), [`SKIP_EOB`].
fn skip_table(ac: &Table) -> Box<[u32; SKIP_SIZE]> {
    const PART: usize = SKIP_SIZE / 8;
    let mut t = Box::new([0u32; SKIP_SIZE]);
    t.par_chunks_mut(PART)
        .enumerate()
        .for_each(|(part, slots)| {
            for (i, slot) in (part * PART..).zip(slots) {
                skip_entry(ac, i, slot);
            }
        });
    t
}

/// One entry of [`skip_table`].
fn skip_entry(ac: &Table, i: usize, slot: &mut u32) {
    {
        let (mut used, mut kadv, mut eob) = (0u32, 0u32, false);
        while used < SKIP_BITS && !eob {
            let rest = ((i as u32) << used) & (SKIP_SIZE as u32 - 1);
            let e = ac.fast[(rest >> (SKIP_BITS - FAST_BITS)) as usize];
            let sym = (e >> 8) & 255;
            let (r, s) = (sym >> 4, sym & 15);
            let code = if e & COMBINED != 0 {
                (e & 63) - s
            } else {
                e & 63
            };
            let (bits, adv) = match (s, r) {
                (0, 15) => (code, 16),
                (0, _) => (code, 0),
                _ => (code + s, r + 1),
            };
            if code == 0 || used + bits > SKIP_BITS || kadv + adv > 64 {
                break;
            }
            used += bits;
            kadv += adv;
            eob = s == 0 && r != 15;
        }
        *slot = used | (kadv << 5) | if eob { SKIP_EOB } else { 0 };
    }
}

// ---------------------------------------------------------------------------------------------
// Scan layout
// ---------------------------------------------------------------------------------------------

/// The scan's tables and MCU layout.
struct Plan {
    /// The distinct derived tables, and per component which are its DC and AC ones.
    tables: Vec<Table>,
    dc_of: [usize; 4],
    ac_of: [usize; 4],
    /// Per table, its skip table ([`skip_table`]) where it is an AC table of the plan, once
    /// built ([`Plan::with_skips`]).
    skips: Vec<Option<Box<[u32; SKIP_SIZE]>>>,
    /// Per MCU position `j`: component, block column and row inside the component's MCU area.
    comp_of: [usize; MAX_BLOCKS_IN_MCU],
    dx: [usize; MAX_BLOCKS_IN_MCU],
    dy: [usize; MAX_BLOCKS_IN_MCU],
    /// Blocks per MCU.
    bpm: usize,
    mcus_x: usize,
    mcus_y: usize,
    total_mcus: usize,
    /// Per component: blocks per plane row, block rows and columns per MCU.
    geom: Vec<(usize, usize, usize)>,
}

const BAD_FRAME: Declined = Declined("inconsistent frame");

impl Plan {
    fn new(frame: &Frame) -> Result<Plan, Declined> {
        let n = frame.components.len();
        if !(1..=4).contains(&n) || frame.mcus_x == 0 || frame.mcus_y == 0 {
            return Err(BAD_FRAME);
        }
        let interleaved = frame.interleaved();
        let mut plan = Plan {
            tables: Vec::with_capacity(2 * n),
            dc_of: [0; 4],
            ac_of: [0; 4],
            skips: Vec::new(),
            comp_of: [0; MAX_BLOCKS_IN_MCU],
            dx: [0; MAX_BLOCKS_IN_MCU],
            dy: [0; MAX_BLOCKS_IN_MCU],
            bpm: 0,
            mcus_x: frame.mcus_x,
            mcus_y: frame.mcus_y,
            total_mcus: frame.mcus_x.checked_mul(frame.mcus_y).ok_or(BAD_FRAME)?,
            geom: Vec::with_capacity(n),
        };
        let mut sources: Vec<(&HuffTable, bool)> = Vec::with_capacity(2 * n);
        for (c, comp) in frame.components.iter().enumerate() {
            for (t, is_dc) in [(&comp.dc, true), (&comp.ac, false)] {
                let i = match sources.iter().position(|&s| s == (t, is_dc)) {
                    Some(i) => i,
                    None => {
                        plan.tables.push(Table::new(t, is_dc)?);
                        sources.push((t, is_dc));
                        sources.len() - 1
                    }
                };
                if is_dc {
                    plan.dc_of[c] = i;
                } else {
                    plan.ac_of[c] = i;
                }
            }
            let (cols, rows) = if interleaved {
                (comp.h, comp.v)
            } else {
                (1, 1)
            };
            if cols == 0
                || rows == 0
                || Some(comp.stored_w) != frame.mcus_x.checked_mul(cols)
                || Some(comp.stored_h) != frame.mcus_y.checked_mul(rows)
            {
                return Err(BAD_FRAME);
            }
            plan.geom.push((comp.stored_w, rows, cols));
            for dy in 0..rows {
                for dx in 0..cols {
                    if plan.bpm == MAX_BLOCKS_IN_MCU {
                        return Err(Declined("more than 10 blocks per MCU"));
                    }
                    plan.comp_of[plan.bpm] = c;
                    plan.dx[plan.bpm] = dx;
                    plan.dy[plan.bpm] = dy;
                    plan.bpm += 1;
                }
            }
        }
        if plan.bpm != frame.blocks_per_mcu() {
            return Err(BAD_FRAME);
        }
        Ok(plan)
    }

    /// Whether `bytes` from the scan's start can hold its blocks at all: each takes at least
    /// two bits (a DC code and an end-of-block). Checked before the planes are allocated, so a
    /// small file cannot make us allocate a huge frame's planes.
    fn fits(&self, bytes: &[u8], frame: &Frame) -> Result<(), Declined> {
        let blocks = self.total_mcus.saturating_mul(self.bpm);
        if bytes
            .len()
            .saturating_sub(frame.scan_start)
            .saturating_mul(4)
            < blocks
        {
            return Err(PAST_END);
        }
        Ok(())
    }

    /// The plan with its skip tables, one per distinct AC table, built in parallel.
    fn with_skips(mut self) -> Plan {
        let n = self.geom.len();
        let tables = &self.tables;
        let ac_of = &self.ac_of[..n];
        self.skips = (0..tables.len())
            .into_par_iter()
            .map(|i| ac_of.contains(&i).then(|| skip_table(&tables[i])))
            .collect();
        self
    }

    /// Component `c`'s DC and AC tables.
    #[inline(always)]
    fn tables_of(&self, c: usize) -> (&Table, &Table) {
        (&self.tables[self.dc_of[c]], &self.tables[self.ac_of[c]])
    }

    /// Offset in component `comp_of[j]`'s plane (or a band of it starting at MCU row `my0`) of
    /// block `j` of MCU `(mx, my)`.
    #[inline(always)]
    fn offset(&self, j: usize, mx: usize, my: usize) -> usize {
        let (sw, rows, cols) = self.geom[self.comp_of[j]];
        ((my * rows + self.dy[j]) * sw + mx * cols + self.dx[j]) * 64
    }

    /// Block `j` of MCU `(mx, my)` in its component's plane of `planes` (as [`Plan::offset`]
    /// places it), with the component; a block outside the planes is refused.
    #[inline(always)]
    fn block_mut<'p>(
        &self,
        planes: &'p mut [&mut [i16]],
        j: usize,
        mx: usize,
        my: usize,
    ) -> Result<(usize, &'p mut [i16; 64]), Declined> {
        let c = self.comp_of[j];
        let off = self.offset(j, mx, my);
        let block = planes
            .get_mut(c)
            .and_then(|p| p.get_mut(off..))
            .and_then(|s| s.first_chunk_mut::<64>())
            .ok_or(BAD_FRAME)?;
        Ok((c, block))
    }
}

// ---------------------------------------------------------------------------------------------
// Markers and unstuffing
// ---------------------------------------------------------------------------------------------

/// The first 0xFF in `bytes[i..end]`.
#[inline]
fn find_ff(bytes: &[u8], mut i: usize, end: usize) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let end = end.min(bytes.len());
    while i + 8 <= end {
        let w = !u64::from_le_bytes(*bytes[i..].first_chunk::<8>()?);
        let zero = w.wrapping_sub(ONES) & !w & HIGHS;
        if zero != 0 {
            return Some(i + (zero.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    (i..end).find(|&k| bytes[k] == 0xFF)
}

/// The first marker at or after `start`: an 0xFF followed by a byte other than 0x00.
fn first_marker(bytes: &[u8], start: usize) -> Option<usize> {
    let mut i = start;
    loop {
        let p = find_ff(bytes, i, bytes.len())?;
        match bytes.get(p + 1) {
            None => return None,
            Some(0) => i = p + 2,
            Some(_) => return Some(p),
        }
    }
}

/// For the 0xFF bytes at positions `q` in `[max(a - 1, seg), b - 1)`: the first one that is a
/// marker, and how many (before it) are followed by a stuffed zero (which lies in `[a, b)`).
fn scan_range(bytes: &[u8], seg: usize, a: usize, b: usize) -> (Option<usize>, usize) {
    let mut q = if a > seg { a - 1 } else { seg };
    let end = b.saturating_sub(1);
    let mut stuffed = 0;
    while let Some(p) = find_ff(bytes, q, end) {
        match bytes.get(p + 1) {
            Some(0) => {
                stuffed += 1;
                q = p + 2;
            }
            _ => return (Some(p), stuffed),
        }
    }
    (None, stuffed)
}

/// Every marker (as [`scan_range`] defines them) with its 0xFF in `[max(a - 1, seg), b - 1)`.
fn markers_in(bytes: &[u8], seg: usize, a: usize, b: usize) -> Vec<usize> {
    let mut q = if a > seg { a - 1 } else { seg };
    let end = b.saturating_sub(1);
    let mut found = Vec::new();
    while let Some(p) = find_ff(bytes, q, end) {
        if bytes.get(p + 1) != Some(&0) {
            found.push(p);
        }
        q = p + 2;
    }
    found
}

/// Copies `bytes[a..b]` into `out`, dropping the zero after each 0xFF (and the one at `a` when
/// `bytes[a - 1]` is an 0xFF of the segment that starts at `seg`). `out` must fit exactly.
fn unstuff_into(
    bytes: &[u8],
    seg: usize,
    a: usize,
    b: usize,
    out: &mut [u8],
) -> Result<(), Declined> {
    const BAD: Declined = Declined("unstuffing miscounted");
    let mut i = a;
    if i > seg && i < b && bytes.get(i) == Some(&0) && bytes.get(i - 1) == Some(&0xFF) {
        i += 1;
    }
    let mut o = 0;
    loop {
        let (run_end, next) = match find_ff(bytes, i, b) {
            Some(p) => (
                p + 1,
                if bytes.get(p + 1) == Some(&0) && p + 1 < b {
                    p + 2
                } else {
                    p + 1
                },
            ),
            None => (b, b),
        };
        let run = bytes.get(i..run_end).ok_or(BAD)?;
        out.get_mut(o..o + run.len())
            .ok_or(BAD)?
            .copy_from_slice(run);
        o += run.len();
        i = next;
        if i >= b {
            break;
        }
    }
    if o == out.len() {
        Ok(())
    } else {
        Err(BAD)
    }
}

/// The segment `bytes[seg..end]` (which holds no marker) unstuffed into `buf`, followed by
/// [`PAD`] zeros; returns its length in bits.
fn unstuff_segment(
    bytes: &[u8],
    seg: usize,
    end: usize,
    buf: &mut Vec<u8>,
) -> Result<usize, Declined> {
    let (_, stuffed) = scan_range(bytes, seg, seg, end + 1);
    let len = (end - seg).saturating_sub(stuffed);
    buf.clear();
    buf.resize(len + PAD, 0);
    unstuff_into(bytes, seg, seg, end, &mut buf[..len])?;
    Ok(len * 8)
}

// ---------------------------------------------------------------------------------------------
// Sequential decode
// ---------------------------------------------------------------------------------------------

const PAST_END: Declined = Declined("the scan data ends inside an MCU");
const DC_RANGE: Declined = Declined("DC outside i16");
const NO_EOI: Declined = Declined("the scan is not followed by EOI");
const BAD_RST: Declined = Declined("restart marker missing or out of order");

/// Sequential decode of the scan starting at `frame.scan_start`. `Err(Declined)` for any
/// irregularity: an invalid Huffman code, a coefficient run past 63, needing a bit past the end
/// of an entropy-coded segment (libjpeg would feed zeros and warn), a DC outside `i16`, the scan
/// not followed by EOI (after the RSTn markers its restart intervals expect, in order), a bad
/// Huffman table.
pub(crate) fn decode_sequential(bytes: &[u8], frame: &Frame) -> Result<Coefficients, Declined> {
    let plan = Plan::new(frame)?;
    plan.fits(bytes, frame)?;
    let mut coefs = Coefficients::zeroed(frame);
    let interval = if frame.restart_interval == 0 {
        plan.total_mcus
    } else {
        frame.restart_interval
    };
    let mut start = frame.scan_start;
    let (mut mcu, mut rst) = (0usize, 0u8);
    let mut buf = Vec::new();
    let mut planes: Vec<&mut [i16]> = coefs.planes.iter_mut().map(|p| &mut p[..]).collect();
    loop {
        let end = first_marker(bytes, start).ok_or(NO_EOI)?;
        let total_bits = unstuff_segment(bytes, start, end, &mut buf)?;
        let n = interval.min(plan.total_mcus - mcu);
        decode_interval_dense(&buf, (0, total_bits), &plan, (mcu, n), &mut planes, 0)?;
        mcu += n;
        let code = bytes.get(end + 1).copied();
        if mcu == plan.total_mcus {
            drop(planes);
            return if code == Some(0xD9) {
                Ok(coefs)
            } else {
                Err(NO_EOI)
            };
        }
        if code != Some(0xD0 + rst) {
            return Err(BAD_RST);
        }
        rst = (rst + 1) & 7;
        start = end + 2;
    }
}

/// MCUs `mcu0..mcu0 + n` (DC predictions from zero) from `data`, into the planes.
fn decode_interval_dense(
    data: &[u8],
    (bit, limit): (usize, usize),
    plan: &Plan,
    (mcu0, n): (usize, usize),
    planes: &mut [&mut [i16]],
    row0: usize,
) -> Result<(), Declined> {
    let mut br = Bits::new(data, bit);
    let mut pred = [0i32; 4];
    let (mut mx, mut my) = (mcu0 % plan.mcus_x, mcu0 / plan.mcus_x - row0);
    for _ in 0..n {
        for j in 0..plan.bpm {
            let (c, block) = plan.block_mut(planes, j, mx, my)?;
            let (dc, ac) = plan.tables_of(c);
            let diff = decode_block(&mut br, dc, ac, &mut Dense(block))?;
            pred[c] += diff;
            block[0] = i16::try_from(pred[c]).map_err(|_| DC_RANGE)?;
        }
        mx += 1;
        if mx == plan.mcus_x {
            mx = 0;
            my += 1;
            if br.position() > limit {
                return Err(PAST_END);
            }
        }
    }
    if br.position() > limit {
        return Err(PAST_END);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Parallel decode
// ---------------------------------------------------------------------------------------------

/// Blocks one worker decoded, in bit order, without their AC coefficients.
#[derive(Default)]
struct Records {
    /// `start bit << 4 | MCU position`.
    keys: Vec<u64>,
    /// DC difference (the absolute DC once the chain is summed, or in restart mode).
    dc: Vec<i32>,
    /// Records where a new guess starts (after an invalid block): the one before does not
    /// lead to it.
    breaks: Vec<usize>,
}

impl Records {
    fn len(&self) -> usize {
        self.keys.len()
    }

    /// Decodes blocks from `br` at MCU position `j` on while `go(start bit, j)` says so,
    /// recording each one that ends by bit `limit`. Returns the state after the last recorded
    /// block, or `None` where the next block ran past `limit`, or was invalid and `guess` is
    /// off. A `guess` (speculative) decode that meets an invalid block starts a new guess at
    /// MCU position 0 one bit past where the error showed.
    fn decode_while(
        &mut self,
        br: &mut Bits,
        limit: usize,
        plan: &Plan,
        mut j: usize,
        guess: bool,
        mut go: impl FnMut(usize, usize) -> bool,
    ) -> Option<(usize, usize)> {
        loop {
            let p = br.position();
            if !go(p, j) {
                return Some((p, j));
            }
            let c = plan.comp_of[j];
            let (dc, ac) = plan.tables_of(c);
            let Some(Some(skip)) = plan.skips.get(plan.ac_of[c]) else {
                return None;
            };
            match skip_block(br, dc, ac, skip) {
                Ok(diff) if br.position() <= limit => {
                    self.keys.push(((p as u64) << 4) | j as u64);
                    self.dc.push(diff);
                }
                Err(_) if guess && br.position() < limit => {
                    self.breaks.push(self.keys.len());
                    *br = Bits::new(br.data, br.position() + 1);
                    j = 0;
                    continue;
                }
                _ => return None,
            }
            j += 1;
            if j == plan.bpm {
                j = 0;
            }
        }
    }
}

/// The blocks of the scan in order, as runs of workers' records: `(store index, first record,
/// end record, index of the first block in the scan)`.
type Pieces = Vec<(usize, usize, usize, usize)>;

/// A worker's first phase: its chunk's blocks, and where it stopped.
struct Phase1 {
    recs: Records,
    next: Option<(usize, usize)>,
}

/// A worker's second phase: the blocks past its chunk until a synchronisation point.
#[derive(Default)]
struct Phase2 {
    recs: Records,
    /// `(worker, record)` whose state equals the one after the last block here.
    sync: Option<(usize, usize)>,
    /// Bits decoded past the chunk's end until the sync point.
    bits: usize,
}

/// How the speculative decode of one file went.
#[derive(Debug, Default, Clone)]
pub(crate) struct SyncStats {
    /// Chunks the data was split into.
    pub chunks: usize,
    /// For each worker but the last that went past its chunk: `(bits, blocks)` it decoded past
    /// its chunk's end until a sync point, or `None` when it found none.
    pub syncs: Vec<Option<(usize, usize)>>,
    /// Workers whose records the chain used.
    pub on_chain: usize,
}

/// Smallest entropy-coded data per chunk [`decode_parallel`] makes.
const MIN_CHUNK_BYTES: usize = 16 << 10;

/// Fewest chunks [`decode_parallel`] splits a scan without restart markers into: its two
/// decoding passes take about 1.8 times the sequential decode's work (measured on a 1920×1080
/// 4:2:0 scan), so two threads gain nothing (the sequential decode runs instead).
const MIN_SPECULATIVE_CHUNKS: usize = 3;

/// The same coefficients as [`decode_sequential`], decoded on up to `threads` workers of the
/// current rayon pool (chunks of at least [`MIN_CHUNK_BYTES`]; sequentially where that leaves
/// one, or fewer than [`MIN_SPECULATIVE_CHUNKS`] without restart markers).
pub(crate) fn decode_parallel(
    bytes: &[u8],
    frame: &Frame,
    threads: usize,
) -> Result<Coefficients, Declined> {
    let data_bytes = bytes.len().saturating_sub(frame.scan_start);
    let chunks = threads.min(data_bytes / MIN_CHUNK_BYTES).max(1);
    let least = if frame.restart_interval > 0 {
        2
    } else {
        MIN_SPECULATIVE_CHUNKS
    };
    if chunks < least {
        return decode_sequential(bytes, frame);
    }
    decode_parallel_chunks(bytes, frame, chunks, None)
}

/// [`decode_parallel`] in exactly `chunks` chunks (restart interval groups, or speculative
/// chunks), whatever the data's size; `stats` gets how the speculation went.
///
/// Three parallel passes: the entropy-coded data unstuffed into one buffer; every block's start
/// bit, MCU position and DC found (speculatively and proven by synchronisation, or from the
/// restart intervals' known starts) without keeping its AC coefficients; bands of MCU rows
/// decoded again from their first block's proven start, straight into the planes.
pub(crate) fn decode_parallel_chunks(
    bytes: &[u8],
    frame: &Frame,
    chunks: usize,
    stats: Option<&mut SyncStats>,
) -> Result<Coefficients, Declined> {
    let chunks = chunks.max(1);
    let seg = frame.scan_start;
    if seg >= bytes.len() || frame.mcus_x == 0 {
        return Err(NO_EOI);
    }
    let ranges = byte_ranges(seg, bytes.len(), chunks);
    let ri = frame.restart_interval;
    // Restart intervals of whole MCU rows are decoded straight into bands of rows.
    let rows = ri > 0 && ri.is_multiple_of(frame.mcus_x);
    let (plan, layout) = rayon::join(
        || Plan::new(frame).map(|p| if rows { p } else { p.with_skips() }),
        || {
            if ri > 0 {
                restart_layout(bytes, frame, &ranges, chunks)
            } else {
                unstuff_parallel(bytes, seg, &ranges).map(|data| Layout {
                    data,
                    groups: Vec::new(),
                })
            }
        },
    );
    let (plan, layout) = (plan?, layout?);
    plan.fits(bytes, frame)?;
    if rows {
        return decode_row_intervals(frame, &plan, &layout);
    }
    let (store, pieces) = if ri > 0 {
        find_interval_blocks(&plan, &layout, ri)?
    } else {
        find_blocks(&layout.data, &plan, chunks, stats)?
    };
    decode_bands(frame, &plan, &layout.data, &store, &pieces, chunks)
}

/// The entropy-coded data unstuffed into one buffer (followed by [`PAD`] zeros), and with
/// restart markers its intervals in groups.
struct Layout {
    data: Vec<u8>,
    groups: Vec<Group>,
}

/// Consecutive restart intervals `first..end`, the first starting at bit `bit` of the layout's
/// data, each `lens[k]` bytes unstuffed.
struct Group {
    first: usize,
    end: usize,
    bit: usize,
    lens: Vec<usize>,
}

/// `[seg, len)` cut into `n` byte ranges.
fn byte_ranges(seg: usize, len: usize, n: usize) -> Vec<(usize, usize)> {
    let size = len - seg;
    (0..n)
        .map(|t| (seg + size * t / n, seg + size * (t + 1) / n))
        .collect()
}

/// The one entropy-coded segment of a scan without restart markers, from `seg` to the first
/// marker (which must be EOI), unstuffed in parallel over `ranges`, followed by [`PAD`] zeros.
fn unstuff_parallel(
    bytes: &[u8],
    seg: usize,
    ranges: &[(usize, usize)],
) -> Result<Vec<u8>, Declined> {
    let scans: Vec<(Option<usize>, usize)> = ranges
        .par_iter()
        .map(|&(a, b)| scan_range(bytes, seg, a, b))
        .collect();
    let end = scans.iter().filter_map(|s| s.0).min().ok_or(NO_EOI)?;
    if bytes.get(end + 1) != Some(&0xD9) {
        return Err(NO_EOI);
    }
    let lens: Vec<usize> = ranges
        .iter()
        .zip(&scans)
        .map(|(&(a, b), s)| {
            if a < end {
                (b.min(end) - a).saturating_sub(s.1)
            } else {
                0
            }
        })
        .collect();
    let total: usize = lens.iter().sum();
    let mut data = crate::pages::zeroed(total + PAD);
    let mut outs = Vec::with_capacity(lens.len());
    let mut rest = &mut data[..total];
    for &len in &lens {
        let (head, tail) = rest.split_at_mut(len);
        outs.push(head);
        rest = tail;
    }
    ranges.par_iter().zip(outs).try_for_each(|(&(a, b), out)| {
        if a < end {
            unstuff_into(bytes, seg, a, b.min(end), out)
        } else {
            Ok(())
        }
    })?;
    Ok(data)
}

/// Every block of a scan without restart markers, found by speculative decoding in `chunks`
/// chunks of `data` (unstuffed, padded) and proven by synchronisation; absolute DCs.
fn find_blocks(
    data: &[u8],
    plan: &Plan,
    chunks: usize,
    stats: Option<&mut SyncStats>,
) -> Result<(Vec<Records>, Pieces), Declined> {
    let total_bits = data.len().saturating_sub(PAD) * 8;
    let starts: Vec<usize> = (0..=chunks)
        .map(|t| total_bits / chunks * t + total_bits % chunks * t / chunks)
        .collect();
    let phase1: Vec<Phase1> = (0..chunks)
        .into_par_iter()
        .map(|t| {
            let mut recs = Records::default();
            let end = starts[t + 1];
            // A block takes at least 2 bits; a few hundred is typical.
            let guess = (end - starts[t]) / 128 + 16;
            recs.keys.reserve(guess);
            recs.dc.reserve(guess);
            let mut br = Bits::new(data, starts[t]);
            let next = recs.decode_while(&mut br, total_bits, plan, 0, t > 0, |p, _| p < end);
            Phase1 { recs, next }
        })
        .collect();
    let phase2: Vec<Phase2> = (0..chunks)
        .into_par_iter()
        .map(|t| follow(data, total_bits, plan, t, &phase1, &starts))
        .collect();
    // The chain from worker 0: store index w for worker w's first phase, chunks + w for its
    // second.
    let total_blocks = plan.total_mcus * plan.bpm;
    let (mut w, mut r, mut g) = (0usize, 0usize, 0usize);
    let mut pieces = Vec::new();
    loop {
        // Worker w's first phase from record r up to a new guess (which r does not lead to),
        // then, if there is none, its second phase.
        let first = &phase1[w].recs;
        let broken = first.breaks.iter().copied().find(|&x| x > r);
        let parts = [
            (w, r, broken.unwrap_or(first.len())),
            (
                chunks + w,
                0,
                if broken.is_some() {
                    0
                } else {
                    phase2[w].recs.len()
                },
            ),
        ];
        for (s, a, end) in parts {
            let b = end.min(a + (total_blocks - g));
            if a < b {
                pieces.push((s, a, b, g));
                g += b - a;
            }
        }
        if g == total_blocks {
            break;
        }
        if broken.is_some() {
            return Err(BAD_CODE);
        }
        match phase2[w].sync {
            Some((u, r2)) if u > w && u < chunks => (w, r) = (u, r2),
            _ => return Err(PAST_END),
        }
    }
    if let Some(stats) = stats {
        stats.chunks = chunks;
        stats.syncs = phase2
            .iter()
            .take(chunks - 1)
            .zip(&phase1)
            .filter(|(_, p1)| p1.next.is_some())
            .map(|(p2, _)| p2.sync.map(|_| (p2.bits, p2.recs.len())))
            .collect();
        let mut on: Vec<usize> = pieces.iter().map(|p| p.0 % chunks).collect();
        on.dedup();
        stats.on_chain = on.len();
    }
    let mut store: Vec<Records> = phase1.into_iter().map(|p| p.recs).collect();
    store.extend(phase2.into_iter().map(|p| p.recs));
    sum_dc(plan, &pieces, &mut store)?;
    Ok((store, pieces))
}

/// Worker `t`'s second phase: from where its first phase stopped, on past its chunk until a
/// block start equals one the owner of that bit recorded.
fn follow(
    data: &[u8],
    total_bits: usize,
    plan: &Plan,
    t: usize,
    phase1: &[Phase1],
    starts: &[usize],
) -> Phase2 {
    let mut out = Phase2::default();
    let Some((p0, j0)) = phase1[t].next else {
        return out;
    };
    if t + 1 >= phase1.len() {
        return out;
    }
    let mut br = Bits::new(data, p0);
    let mut sync = None;
    let end = out
        .recs
        .decode_while(&mut br, total_bits, plan, j0, false, |p, j| {
            if p >= total_bits {
                return false;
            }
            let u = starts.partition_point(|&s| s <= p).saturating_sub(1);
            if u <= t || u >= phase1.len() {
                return true;
            }
            let key = ((p as u64) << 4) | j as u64;
            if let Ok(r) = phase1[u].recs.keys.binary_search(&key) {
                sync = Some((u, r));
                return false;
            }
            true
        });
    out.sync = sync;
    if let (Some((p, _)), Some(_)) = (end, sync) {
        out.bits = p - starts[t + 1];
    }
    out
}

/// Turns the DC differences of the pieces' records into absolute DCs (per component, in scan
/// order), refusing any outside `i16`.
fn sum_dc(plan: &Plan, pieces: &Pieces, store: &mut [Records]) -> Result<(), Declined> {
    let mut slots: Vec<Option<&mut Records>> = store.iter_mut().map(Some).collect();
    let mut parts: Vec<(&mut Records, usize, usize)> = Vec::with_capacity(pieces.len());
    for &(s, a, b, _) in pieces {
        let recs = slots.get_mut(s).and_then(Option::take).ok_or(BAD_FRAME)?;
        parts.push((recs, a, b));
    }
    let sums: Vec<[i64; 4]> = parts
        .par_iter()
        .map(|(recs, a, b)| {
            let mut s = [0i64; 4];
            for (key, &dc) in recs.keys[*a..*b].iter().zip(&recs.dc[*a..*b]) {
                s[plan.comp_of[(key & 15) as usize]] += i64::from(dc);
            }
            s
        })
        .collect();
    let mut pred = [0i64; 4];
    let starts: Vec<[i64; 4]> = sums
        .iter()
        .map(|s| {
            let start = pred;
            for (p, d) in pred.iter_mut().zip(s) {
                *p += d;
            }
            start
        })
        .collect();
    parts
        .par_iter_mut()
        .zip(starts)
        .try_for_each(|((recs, a, b), mut pred)| {
            let Records { keys, dc, .. } = &mut **recs;
            for (key, dc) in keys[*a..*b].iter().zip(&mut dc[*a..*b]) {
                let c = plan.comp_of[(key & 15) as usize];
                pred[c] += i64::from(*dc);
                *dc = i32::from(i16::try_from(pred[c]).map_err(|_| DC_RANGE)?);
            }
            Ok(())
        })
}

/// Restart mode: the restart markers checked (RST0..7 in turn between the intervals, EOI after
/// the last), the intervals grouped into at most `chunks` groups of about equal bytes, and their
/// segments unstuffed into one buffer, in parallel.
fn restart_layout(
    bytes: &[u8],
    frame: &Frame,
    ranges: &[(usize, usize)],
    chunks: usize,
) -> Result<Layout, Declined> {
    let seg = frame.scan_start;
    let ri = frame.restart_interval;
    let total_mcus = frame.mcus_x.checked_mul(frame.mcus_y).ok_or(BAD_FRAME)?;
    let intervals = total_mcus.div_ceil(ri);
    let found: Vec<Vec<usize>> = ranges
        .par_iter()
        .map(|&(a, b)| markers_in(bytes, seg, a, b))
        .collect();
    let markers: Vec<usize> = found.into_iter().flatten().take(intervals).collect();
    if markers.len() < intervals {
        return Err(NO_EOI);
    }
    for (k, &q) in markers.iter().enumerate() {
        let want = if k + 1 == intervals {
            0xD9
        } else {
            0xD0 + (k & 7) as u8
        };
        if bytes.get(q + 1) != Some(&want) {
            return Err(if want == 0xD9 { NO_EOI } else { BAD_RST });
        }
    }
    let start_of = |k: usize| if k == 0 { seg } else { markers[k - 1] + 2 };
    let span = markers[intervals - 1] - seg;
    let mut cuts = vec![0usize];
    for k in 1..intervals {
        if (start_of(k) - seg) * chunks >= span * cuts.len() && cuts.len() < chunks {
            cuts.push(k);
        }
    }
    cuts.push(intervals);
    let mut groups: Vec<Group> = cuts
        .par_windows(2)
        .map(|w| Group {
            first: w[0],
            end: w[1],
            bit: 0,
            lens: (w[0]..w[1])
                .map(|k| {
                    let (a, b) = (start_of(k), markers[k]);
                    (b - a).saturating_sub(scan_range(bytes, a, a, b + 1).1)
                })
                .collect(),
        })
        .collect();
    let mut at = 0usize;
    for g in &mut groups {
        g.bit = at * 8;
        at += g.lens.iter().sum::<usize>();
    }
    let mut data = crate::pages::zeroed(at + PAD);
    let mut outs = Vec::with_capacity(groups.len());
    let mut rest = &mut data[..at];
    for g in &groups {
        let (head, tail) = rest.split_at_mut(g.lens.iter().sum());
        outs.push(head);
        rest = tail;
    }
    groups.par_iter().zip(outs).try_for_each(|(g, out)| {
        let mut out = out;
        for (k, &len) in (g.first..g.end).zip(&g.lens) {
            let (head, tail) = out.split_at_mut(len);
            unstuff_into(bytes, start_of(k), start_of(k), markers[k], head)?;
            out = tail;
        }
        Ok::<(), Declined>(())
    })?;
    Ok(Layout { data, groups })
}

/// Restart mode, intervals not of whole MCU rows: every block found by decoding the interval
/// groups from their known starts, with absolute DCs.
fn find_interval_blocks(
    plan: &Plan,
    layout: &Layout,
    ri: usize,
) -> Result<(Vec<Records>, Pieces), Declined> {
    let data = &layout.data[..];
    let store: Vec<Records> = layout
        .groups
        .par_iter()
        .map(|g| {
            let mut recs = Records::default();
            let mut bit = g.bit;
            for (k, &len) in (g.first..g.end).zip(&g.lens) {
                let limit = bit + len * 8;
                let n = ri.min(plan.total_mcus - k * ri) * plan.bpm;
                let first = recs.len();
                let mut br = Bits::new(data, bit);
                let mut calls = 0;
                recs.decode_while(&mut br, limit, plan, 0, false, |_, _| {
                    calls += 1;
                    calls <= n
                });
                if recs.len() != first + n {
                    return Err(PAST_END);
                }
                let mut pred = [0i32; 4];
                let Records { keys, dc, .. } = &mut recs;
                for (key, dc) in keys[first..].iter().zip(&mut dc[first..]) {
                    let c = plan.comp_of[(key & 15) as usize];
                    pred[c] += *dc;
                    *dc = i32::from(i16::try_from(pred[c]).map_err(|_| DC_RANGE)?);
                }
                bit = limit;
            }
            Ok(recs)
        })
        .collect::<Result<_, Declined>>()?;
    let pieces = layout
        .groups
        .iter()
        .zip(&store)
        .enumerate()
        .map(|(s, (g, recs))| (s, 0, recs.len(), g.first * ri * plan.bpm))
        .collect();
    Ok((store, pieces))
}

/// Restart mode, intervals of whole MCU rows: each group of intervals decoded from its known
/// starts straight into its band of rows, in parallel.
fn decode_row_intervals(
    frame: &Frame,
    plan: &Plan,
    layout: &Layout,
) -> Result<Coefficients, Declined> {
    let ri = frame.restart_interval;
    let rows_per = ri / plan.mcus_x;
    let mut cuts: Vec<usize> = layout.groups.iter().map(|g| g.first * rows_per).collect();
    cuts.push(plan.mcus_y);
    let data = &layout.data[..];
    planes_in_bands(plan, &cuts, |k, slices| {
        let g = layout.groups.get(k).ok_or(BAD_FRAME)?;
        let mut bit = g.bit;
        for (i, &len) in (g.first..g.end).zip(&g.lens) {
            let limit = bit + len * 8;
            let n = ri.min(plan.total_mcus - i * ri);
            let at = (i * ri, n);
            decode_interval_dense(data, (bit, limit), plan, at, slices, g.first * rows_per)?;
            bit = limit;
        }
        Ok(())
    })
}

/// The planes of the plan's frame, written by `band` in parallel over bands of MCU rows (`cuts`: the
/// bands' first rows, then `mcus_y`), each band's part zeroed first by its own thread: the
/// calling thread does not zero 6 MB (`Coefficients::zeroed`'s calloc memsets memory the heap
/// reuses) while the others wait, and fresh pages fault in on the threads that write them.
fn planes_in_bands(
    plan: &Plan,
    cuts: &[usize],
    band: impl Fn(usize, &mut [&mut [i16]]) -> Result<(), Declined> + Sync,
) -> Result<Coefficients, Declined> {
    use std::mem::MaybeUninit;
    let lens: Vec<usize> = plan
        .geom
        .iter()
        .map(|&(sw, rows, _)| plan.mcus_y * rows * sw * 64)
        .collect();
    let mut planes: Vec<Vec<i16>> = lens.iter().map(|&n| Vec::with_capacity(n)).collect();
    let mut per_band: Vec<Vec<&mut [MaybeUninit<i16>]>> =
        (1..cuts.len()).map(|_| Vec::new()).collect();
    for ((plane, &(sw, rows, _)), &n) in planes.iter_mut().zip(&plan.geom).zip(&lens) {
        let mut rest = plane.spare_capacity_mut().get_mut(..n).ok_or(BAD_FRAME)?;
        for (parts, w) in per_band.iter_mut().zip(cuts.windows(2)) {
            let len = w[1].saturating_sub(w[0]) * rows * sw * 64;
            let (head, tail) = rest.split_at_mut_checked(len).ok_or(BAD_FRAME)?;
            parts.push(head);
            rest = tail;
        }
        if !rest.is_empty() {
            return Err(BAD_FRAME);
        }
    }
    per_band
        .into_par_iter()
        .enumerate()
        .try_for_each(|(k, parts)| {
            let mut slices: Vec<&mut [i16]> = parts
                .into_iter()
                .map(|part| {
                    part.fill(MaybeUninit::new(0));
                    // SAFETY: every element of `part` was just initialised, and
                    // `MaybeUninit<i16>` has the size, alignment and validity of `i16`.
                    unsafe { &mut *(part as *mut [MaybeUninit<i16>] as *mut [i16]) }
                })
                .collect();
            band(k, &mut slices)
        })?;
    for (plane, n) in planes.iter_mut().zip(lens) {
        // SAFETY: the bands' parts cover the first `n` elements exactly (checked above) and each
        // band zeroed its parts before anything else; all bands succeeded, so all are
        // initialised; `n` is within the capacity reserved.
        unsafe { plane.set_len(n) };
    }
    Ok(Coefficients { planes })
}

/// The planes: bands of MCU rows (about equal bits each, `bands` of them at most) decoded again,
/// in parallel, each block from its proven start bit, with its absolute DC from the records.
fn decode_bands(
    frame: &Frame,
    plan: &Plan,
    data: &[u8],
    store: &[Records],
    pieces: &Pieces,
    bands: usize,
) -> Result<Coefficients, Declined> {
    let total_blocks = plan.total_mcus * plan.bpm;
    if pieces.iter().map(|p| p.2 - p.1).sum::<usize>() != total_blocks {
        return Err(PAST_END);
    }
    let interval_blocks = match frame.restart_interval {
        0 => usize::MAX,
        ri => ri * plan.bpm,
    };
    // The record of block `g`: (records, index).
    let record = |g: usize| -> Option<(&Records, usize)> {
        let i = pieces.partition_point(|p| p.3 + (p.2 - p.1) <= g);
        let &(s, a, _, g0) = pieces.get(i)?;
        Some((store.get(s)?, a + (g - g0)))
    };
    let bit_of = |g: usize| {
        record(g)
            .and_then(|(recs, r)| recs.keys.get(r))
            .map(|k| k >> 4)
    };
    // Band cuts at MCU rows, about equal bits.
    let per_row = plan.mcus_x * plan.bpm;
    let first = bit_of(0).ok_or(BAD_FRAME)?;
    let last = bit_of(total_blocks - 1).ok_or(BAD_FRAME)? + 1;
    let span = last - first;
    let mut cuts = vec![0usize];
    for row in 1..plan.mcus_y {
        let at = bit_of(row * per_row).ok_or(BAD_FRAME)? - first;
        if at * (bands as u64) >= span * cuts.len() as u64 && cuts.len() < bands {
            cuts.push(row);
        }
    }
    cuts.push(plan.mcus_y);
    planes_in_bands(plan, &cuts, |k, slices| {
        let (g0, g1) = (cuts[k] * per_row, cuts[k + 1] * per_row);
        let w = [cuts[k], cuts[k + 1]];
        let mut pi = pieces.partition_point(|p| p.3 + (p.2 - p.1) <= g0);
        let mut g = g0;
        let mut br = Bits::new(data, 0);
        while g < g1 {
            let &(s, a, b, pg) = pieces.get(pi).ok_or(BAD_FRAME)?;
            let recs = store.get(s).ok_or(BAD_FRAME)?;
            let stop = g1.min(pg + (b - a));
            let (mcu, mut j) = (g / plan.bpm, g % plan.bpm);
            let (mut mx, mut my) = (mcu % plan.mcus_x, mcu / plan.mcus_x - w[0]);
            for (r, gg) in (a + (g - pg)..a + (stop - pg)).zip(g..) {
                let (key, dc) = (recs.keys[r], recs.dc[r]);
                let bit = (key >> 4) as usize;
                if br.position() != bit {
                    // Blocks follow each other, but for the band's first and, with restart
                    // markers, each interval's first.
                    if gg != g0 && gg % interval_blocks != 0 {
                        return Err(BAD_FRAME);
                    }
                    br = Bits::new(data, bit);
                }
                if (key & 15) as usize != j {
                    return Err(BAD_FRAME);
                }
                let (c, block) = plan.block_mut(slices, j, mx, my)?;
                let (dct, act) = plan.tables_of(c);
                decode_block(&mut br, dct, act, &mut Dense(block))?;
                block[0] = dc as i16;
                j += 1;
                if j == plan.bpm {
                    j = 0;
                    mx += 1;
                    if mx == plan.mcus_x {
                        mx = 0;
                        my += 1;
                    }
                }
            }
            g = stop;
            pi += 1;
        }
        // The band's last block ends where the next band's first starts (or, for the last
        // band, inside the data), as the first pass found.
        let end = if g1 == total_blocks {
            data.len().saturating_sub(PAD) * 8
        } else if g1 % interval_blocks == 0 {
            usize::MAX
        } else {
            bit_of(g1).ok_or(BAD_FRAME)? as usize
        };
        if (g1 == total_blocks && br.position() > end)
            || (g1 < total_blocks && end != usize::MAX && br.position() != end)
        {
            return Err(BAD_FRAME);
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jpeg::libjpeg_frame;
    use crate::jpeg::tests::{encode, fixture_jpegs};
    use mozjpeg_sys as ffi;
    use std::os::raw::c_int;

    /// The compressor's `error_exit`: must not return; a test panics.
    unsafe extern "C-unwind" fn compress_error(_: &mut ffi::jpeg_common_struct) {
        panic!("libjpeg compression error");
    }

    /// Like [`encode`] (same pixels), with a quality, optimised Huffman tables and restart
    /// markers every `restart.0` MCUs or every `restart.1` MCU rows.
    fn encode_with(
        (w, h): (usize, usize),
        grey: bool,
        samp: (i32, i32),
        quality: i32,
        optimize: bool,
        restart: (u32, i32),
    ) -> Vec<u8> {
        let comps = if grey { 1 } else { 3 };
        let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (w * 7919 + h) as u64;
        let pixels: Vec<u8> = (0..w * h * comps)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let (px, py, c) = ((i / comps) % w, (i / comps) / w, i % comps);
                let smooth = (px * 255 / w + py * 255 / h + c * 85) as u64;
                ((smooth + (x >> 60)) % 256) as u8
            })
            .collect();
        // SAFETY: as in `jpeg::tests::encode`: the compressor and its error manager live on
        // this frame; each row pointer covers a row of `pixels`; the output is libjpeg's malloc,
        // copied and freed here.
        unsafe {
            let mut err: ffi::jpeg_error_mgr = std::mem::zeroed();
            let mut c: ffi::jpeg_compress_struct = std::mem::zeroed();
            let e = ffi::jpeg_std_error(&mut err);
            e.error_exit = Some(compress_error);
            c.common.err = e;
            ffi::jpeg_create_compress(&mut c);
            let mut buf: *mut u8 = std::ptr::null_mut();
            let mut size: std::os::raw::c_ulong = 0;
            ffi::jpeg_mem_dest(&mut c, &mut buf, &mut size);
            c.image_width = w as u32;
            c.image_height = h as u32;
            c.input_components = comps as c_int;
            c.in_color_space = if grey {
                ffi::J_COLOR_SPACE::JCS_GRAYSCALE
            } else {
                ffi::J_COLOR_SPACE::JCS_RGB
            };
            ffi::jpeg_c_set_int_param(
                &mut c,
                ffi::J_INT_PARAM::JINT_COMPRESS_PROFILE,
                ffi::JCP_FASTEST as c_int,
            );
            ffi::jpeg_set_defaults(&mut c);
            ffi::jpeg_set_quality(&mut c, quality, 1);
            if !grey {
                let ci = std::slice::from_raw_parts_mut(c.comp_info, 3);
                (ci[0].h_samp_factor, ci[0].v_samp_factor) = samp;
                for k in &mut ci[1..] {
                    (k.h_samp_factor, k.v_samp_factor) = (1, 1);
                }
            }
            c.optimize_coding = i32::from(optimize) as _;
            c.restart_interval = restart.0;
            c.restart_in_rows = restart.1;
            ffi::jpeg_start_compress(&mut c, 1);
            while (c.next_scanline as usize) < h {
                let row = [pixels[c.next_scanline as usize * w * comps..].as_ptr()];
                ffi::jpeg_write_scanlines(&mut c, row.as_ptr(), 1);
            }
            ffi::jpeg_finish_compress(&mut c);
            let out = std::slice::from_raw_parts(buf, size as usize).to_vec();
            ffi::jpeg_destroy_compress(&mut c);
            libc::free(buf.cast());
            out
        }
    }

    /// Where two coefficient sets first differ, if they do.
    fn first_diff(frame: &Frame, a: &Coefficients, b: &Coefficients) -> Option<String> {
        if a.planes.len() != b.planes.len() {
            return Some(format!("{} vs {} planes", a.planes.len(), b.planes.len()));
        }
        for (c, (pa, pb)) in a.planes.iter().zip(&b.planes).enumerate() {
            if pa.len() != pb.len() {
                return Some(format!("plane {c}: {} vs {} values", pa.len(), pb.len()));
            }
            if let Some(i) = pa.iter().zip(pb).position(|(x, y)| x != y) {
                let sw = frame.components[c].stored_w;
                let (bx, by) = ((i / 64) % sw, (i / 64) / sw);
                return Some(format!(
                    "plane {c} block ({bx}, {by}): {:?} vs {:?}",
                    a.block(frame, c, bx, by),
                    b.block(frame, c, bx, by)
                ));
            }
        }
        None
    }

    /// Our frame's geometry is libjpeg's.
    fn assert_same_geometry(name: &str, ours: &Frame, theirs: &Frame) {
        assert_eq!(
            (ours.width, ours.height, ours.max_h, ours.max_v),
            (theirs.width, theirs.height, theirs.max_h, theirs.max_v),
            "{name}"
        );
        assert_eq!(
            (ours.mcus_x, ours.mcus_y),
            (theirs.mcus_x, theirs.mcus_y),
            "{name}"
        );
        assert_eq!(ours.components.len(), theirs.components.len(), "{name}");
        for (a, b) in ours.components.iter().zip(&theirs.components) {
            assert_eq!((a.h, a.v, a.quant), (b.h, b.v, b.quant), "{name}");
            assert_eq!(
                (a.sampled_width, a.sampled_height),
                (b.sampled_width, b.sampled_height),
                "{name}"
            );
            assert_eq!(
                (
                    a.width_in_blocks,
                    a.height_in_blocks,
                    a.stored_w,
                    a.stored_h
                ),
                (
                    b.width_in_blocks,
                    b.height_in_blocks,
                    b.stored_w,
                    b.stored_h
                ),
                "{name}"
            );
        }
    }

    /// Chunk counts forced on every file: many speculative workers even on tiny scans.
    const CHUNKS: [usize; 6] = [2, 3, 5, 8, 17, 64];

    /// The sequential decode, `decode_parallel` at 1, 2, 3, 7 and 16 threads and
    /// `decode_parallel_chunks` at [`CHUNKS`] give libjpeg's coefficients (all of each stored
    /// plane, the dummy blocks of interleaved scans included). Returns the frame.
    fn check(bytes: &[u8], name: &str) -> Frame {
        let (theirs, want) = libjpeg_frame(bytes).expect("libjpeg reads it");
        let frame = parse_frame(bytes).unwrap_or_else(|| panic!("{name}: parse_frame"));
        assert_same_geometry(name, &frame, &theirs);
        let seq = decode_sequential(bytes, &frame).unwrap_or_else(|e| panic!("{name}: {e:?}"));
        if let Some(d) = first_diff(&frame, &seq, &want) {
            panic!("{name}: sequential: {d}");
        }
        for threads in [1, 2, 3, 7, 16] {
            let got = decode_parallel(bytes, &frame, threads)
                .unwrap_or_else(|e| panic!("{name}: {threads} threads: {e:?}"));
            if let Some(d) = first_diff(&frame, &got, &want) {
                panic!("{name}: {threads} threads: {d}");
            }
        }
        for chunks in CHUNKS {
            let got = decode_parallel_chunks(bytes, &frame, chunks, None)
                .unwrap_or_else(|e| panic!("{name}: {chunks} chunks: {e:?}"));
            if let Some(d) = first_diff(&frame, &got, &want) {
                panic!("{name}: {chunks} chunks: {d}");
            }
        }
        frame
    }

    /// `parse_frame` agrees with libjpeg on every fixture it takes, takes every single-scan grey
    /// or YCbCr fixture (which `frame_of` then keeps), and refuses progressive and CMYK files.
    #[test]
    fn parse_frame_agrees_with_libjpeg() {
        let (mut taken, mut refused) = (0, 0);
        for path in fixture_jpegs() {
            let bytes = std::fs::read(&path).expect("fixture");
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let baseline = !name.contains("prog") && !name.contains("cmyk");
            let hd = crate::jpeg::read_header(&bytes).expect("header");
            let kept = crate::jpeg::frame_of(&bytes, hd.width, hd.height, 64 << 20);
            match parse_frame(&bytes) {
                Some(frame) => {
                    let (theirs, _) = libjpeg_frame(&bytes).expect("libjpeg");
                    assert_same_geometry(&name, &frame, &theirs);
                    assert!(baseline, "{name} taken");
                    let kept = kept.unwrap_or_else(|| panic!("{name}: frame_of refused"));
                    assert_eq!(kept.scan_start, frame.scan_start, "{name}");
                    taken += 1;
                }
                None => {
                    assert!(!baseline, "{name} refused");
                    assert!(kept.is_none(), "{name}");
                    refused += 1;
                }
            }
        }
        eprintln!("parse_frame: {taken} fixture JPEGs taken, {refused} refused");
        assert!(taken >= 60 && refused >= 40, "{taken} {refused}");
        for (grey, samp) in [(false, (2, 2)), (true, (1, 1))] {
            let prog = encode(64, 48, grey, samp, true);
            assert!(parse_frame(&prog).is_none());
            assert!(crate::jpeg::frame_of(&prog, 64, 48, 64 << 20).is_none());
            let base = encode(64, 48, grey, samp, false);
            assert!(crate::jpeg::frame_of(&base, 64, 48, 64 << 20).is_some());
        }
    }

    /// `jpeg_make_d_derived_tbl`'s refusals: more than 256 symbols, a code space over-full or
    /// full (no code may be all ones), DC symbols over 15.
    #[test]
    fn huffman_table_refusals_follow_libjpeg() {
        let table = |lens: &[(usize, u8)], values: Vec<u8>| {
            let mut bits = [0u8; 17];
            for &(l, n) in lens {
                bits[l] = n;
            }
            HuffTable { bits, values }
        };
        // Codes 0, 10, 110: 111 stays free.
        let ok = table(&[(1, 1), (2, 1), (3, 1)], vec![0, 1, 2]);
        assert!(Table::new(&ok, true).is_ok() && Table::new(&ok, false).is_ok());
        // Codes 0, 10, 110, 111: full.
        let full = table(&[(1, 1), (2, 1), (3, 2)], vec![0, 1, 2, 3]);
        assert!(Table::new(&full, false).is_err());
        assert!(Table::new(&table(&[(1, 2)], vec![0, 1]), false).is_err());
        assert!(Table::new(&table(&[(2, 5)], vec![0; 5]), false).is_err());
        let big = table(&[(16, 255), (15, 2)], vec![0; 257]);
        assert!(Table::new(&big, false).is_err());
        let sixteen = table(&[(2, 1)], vec![16]);
        assert!(Table::new(&sixteen, true).is_err() && Table::new(&sixteen, false).is_ok());
        // An empty table is accepted (every code is then invalid).
        assert!(Table::new(&table(&[], vec![]), false).is_ok());
    }

    /// The offset of the first `FF code` marker segment of a file our encoder wrote.
    fn marker(bytes: &[u8], code: u8) -> usize {
        bytes
            .windows(2)
            .position(|w| w == [0xFF, code])
            .expect("marker")
    }

    /// `parse_frame` refuses what our decode does not take, and what libjpeg refuses.
    #[test]
    fn parse_frame_refusals() {
        let good = encode(40, 24, false, (2, 2), false);
        assert!(parse_frame(&good).is_some());
        let sof = marker(&good, 0xC0);
        let sos = marker(&good, 0xDA);
        let dht = marker(&good, 0xC4);
        let patched = |at: usize, b: &[u8]| {
            let mut bad = good.clone();
            bad[at..at + b.len()].copy_from_slice(b);
            bad
        };
        let refused = [
            ("progressive", patched(sof + 1, &[0xC2])),
            ("arithmetic", patched(sof + 1, &[0xC9])),
            ("lossless", patched(sof + 1, &[0xC3])),
            ("12-bit", patched(sof + 4, &[12])),
            ("height 0", patched(sof + 5, &[0, 0])),
            ("sampling 5", patched(sof + 11, &[0x51])),
            ("sampling 0", patched(sof + 11, &[0x01])),
            ("quant table 4", patched(sof + 12, &[4])),
            ("undefined quant table", patched(sof + 12, &[3])),
            (
                "duplicate component id",
                patched(sof + 13, &[good[sof + 10]]),
            ),
            ("scan component order", patched(sos + 5, &[good[sos + 7]])),
            ("DC table 4", patched(sos + 6, &[0x40])),
            ("undefined AC table", patched(sos + 6, &[0x02])),
            ("Se 62", patched(sos + 12, &[62])),
            ("Ah/Al", patched(sos + 13, &[0x01])),
            ("DHT class 2", patched(dht + 4, &[0x20])),
            ("no SOI", patched(0, &[0xFF, 0xD9])),
        ];
        for (name, bad) in &refused {
            assert!(parse_frame(bad).is_none(), "{name}");
        }
        // A DRI segment of the wrong length, a DNL, and one of the right length.
        let with = |seg: &[u8]| {
            let mut b = good[..2].to_vec();
            b.extend_from_slice(seg);
            b.extend_from_slice(&good[2..]);
            b
        };
        assert!(parse_frame(&with(&[0xFF, 0xDD, 0, 5, 0, 4, 0])).is_none());
        assert!(parse_frame(&with(&[0xFF, 0xDC, 0, 4, 0, 24])).is_none());
        let dri = parse_frame(&with(&[0xFF, 0xDD, 0, 4, 0, 7])).expect("DRI");
        assert_eq!(dri.restart_interval, 7);
        // APPn / COM skipped, garbage between markers skipped as libjpeg does.
        let app =
            parse_frame(&with(&[0xFF, 0xE5, 0, 4, 1, 2, 0x12, 0xFF, 0xFE, 0, 2])).expect("APP5");
        assert_eq!(
            app.scan_start,
            parse_frame(&good).expect("good").scan_start + 11
        );
        // 4 components (CMYK) and 2 are refused.
        let cmyk = std::fs::read(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../fixtures/prep/jpeg/astronaut_16x16_cmyk.jpg"),
        )
        .expect("cmyk fixture");
        assert!(parse_frame(&cmyk).is_none());
    }

    #[test]
    fn decodes_equal_libjpeg_on_fixtures() {
        let mut n = 0;
        for path in fixture_jpegs() {
            let bytes = std::fs::read(&path).expect("fixture");
            let hd = crate::jpeg::read_header(&bytes).expect("header");
            if crate::jpeg::frame_of(&bytes, hd.width, hd.height, 64 << 20).is_none() {
                continue;
            }
            check(&bytes, &path.display().to_string());
            n += 1;
        }
        eprintln!("entropy decode: {n} fixture JPEGs exact");
        assert!(n >= 60, "{n}");
    }

    #[test]
    fn decodes_equal_libjpeg_on_synthetic_jpegs() {
        let sizes = [
            (1, 1),
            (8, 8),
            (17, 9),
            (33, 31),
            (127, 65),
            (250, 131),
            (640, 480),
            (1920, 1080),
        ];
        let mut n = 0;
        for (w, h) in sizes {
            for (grey, samp) in [
                (false, (1, 1)),
                (false, (2, 1)),
                (false, (1, 2)),
                (false, (2, 2)),
                (true, (1, 1)),
            ] {
                let name = format!("{w}x{h} grey={grey} {samp:?}");
                check(&encode(w, h, grey, samp, false), &name);
                n += 1;
            }
        }
        // Other qualities, optimised tables.
        for (w, h) in [(33, 31), (250, 131), (640, 480)] {
            for (grey, samp) in [(false, (2, 2)), (false, (1, 2)), (true, (1, 1))] {
                for (q, opt) in [(10, false), (50, true), (100, false), (100, true)] {
                    let name = format!("{w}x{h} grey={grey} {samp:?} q{q} opt={opt}");
                    check(&encode_with((w, h), grey, samp, q, opt, (0, 0)), &name);
                    n += 1;
                }
            }
        }
        eprintln!("entropy decode: {n} synthetic JPEGs exact");
    }

    #[test]
    fn decodes_equal_libjpeg_with_restart_markers() {
        let mut n = 0;
        for (w, h) in [(8, 8), (17, 9), (127, 65), (640, 480), (1920, 1080)] {
            for (grey, samp) in [(false, (2, 2)), (false, (2, 1)), (true, (1, 1))] {
                for restart in [(1, 0), (3, 0), (7, 0), (64, 0), (0, 1), (0, 2)] {
                    let bytes = encode_with((w, h), grey, samp, 90, restart.0 == 7, restart);
                    let name = format!("{w}x{h} grey={grey} {samp:?} restart {restart:?}");
                    let frame = check(&bytes, &name);
                    assert!(frame.restart_interval > 0, "{name}");
                    n += 1;
                }
            }
        }
        eprintln!("entropy decode: {n} JPEGs with restart markers exact");
    }

    /// Summary of the sync statistics: synced / went past, mean and max bits and blocks.
    fn describe(s: &SyncStats) -> String {
        let ok: Vec<(usize, usize)> = s.syncs.iter().flatten().copied().collect();
        let n = ok.len().max(1);
        format!(
            "{} chunks: {}/{} synced, past chunk end mean {} bits / {} blocks, max {} bits / {} \
             blocks; {} workers on the chain",
            s.chunks,
            ok.len(),
            s.syncs.len(),
            ok.iter().map(|x| x.0).sum::<usize>() / n,
            ok.iter().map(|x| x.1).sum::<usize>() / n,
            ok.iter().map(|x| x.0).max().unwrap_or(0),
            ok.iter().map(|x| x.1).max().unwrap_or(0),
            s.on_chain
        )
    }

    /// How fast the speculative workers synchronise: on the 1920×1080 synthetic file (4:2:0,
    /// 4:4:4, grey) and the larger fixtures, at 16 and 64 chunks. Every boundary synchronises.
    #[test]
    fn speculation_synchronises() {
        let mut files: Vec<(String, Vec<u8>)> = vec![
            (
                "synthetic 1920x1080 4:2:0".into(),
                encode(1920, 1080, false, (2, 2), false),
            ),
            (
                "synthetic 1920x1080 4:4:4".into(),
                encode(1920, 1080, false, (1, 1), false),
            ),
            (
                "synthetic 1920x1080 grey".into(),
                encode(1920, 1080, true, (1, 1), false),
            ),
            (
                "synthetic 1920x1080 4:2:0 q75 optimised".into(),
                encode_with((1920, 1080), false, (2, 2), 75, true, (0, 0)),
            ),
        ];
        for path in fixture_jpegs() {
            let bytes = std::fs::read(&path).expect("fixture");
            if bytes.len() > 10_000 && parse_frame(&bytes).is_some() {
                files.push((path.file_name().unwrap().to_string_lossy().into(), bytes));
            }
        }
        for (name, bytes) in &files {
            let frame = parse_frame(bytes).expect("frame");
            let (_, want) = libjpeg_frame(bytes).expect("libjpeg");
            for chunks in [16, 64] {
                let mut stats = SyncStats::default();
                let got = decode_parallel_chunks(bytes, &frame, chunks, Some(&mut stats))
                    .expect("decode");
                assert!(first_diff(&frame, &got, &want).is_none(), "{name}");
                eprintln!("{name}: {}", describe(&stats));
                if bytes.len() >= 100_000 {
                    assert_eq!(stats.syncs.len(), chunks - 1, "{name}");
                    assert!(stats.syncs.iter().all(Option::is_some), "{name}");
                    assert_eq!(stats.on_chain, chunks, "{name}");
                }
            }
        }
    }

    /// Hostile bytes in the scan of a 640×480 file (flipped bits, the file cut, runs of zeros,
    /// markers written over or inserted): no decode panics, and whatever ours decodes libjpeg
    /// decodes to the same coefficients.
    #[test]
    fn corrupted_scans_decline_or_agree() {
        let mut outcomes = [0usize; 2];
        for (grey, samp, restart) in [
            (false, (2, 2), (0, 0)),
            (true, (1, 1), (0, 0)),
            (false, (2, 1), (0, 1)),
            (false, (2, 2), (7, 0)),
        ] {
            let good = encode_with((640, 480), grey, samp, 90, false, restart);
            let frame = parse_frame(&good).expect("frame");
            let body = frame.scan_start;
            let len = good.len() - body;
            let mut cases: Vec<Vec<u8>> = Vec::new();
            for k in 0..41 {
                let pos = body + len * k / 41 + k;
                for flip in [0x01u8, 0x10, 0x80, 0xFF] {
                    let mut bad = good.clone();
                    bad[pos] ^= flip;
                    cases.push(bad);
                }
                let mut cut = good.clone();
                cut.truncate(pos);
                cases.push(cut);
                let mut zeros = good.clone();
                let end = (pos + 16).min(good.len() - 2);
                zeros[pos..end].fill(0);
                cases.push(zeros);
                for marker in [0xD9u8, 0xD0, 0xD3, 0xC4, 0xFF, 0x00, 0x01] {
                    let mut over = good.clone();
                    if pos + 2 < good.len() {
                        over[pos] = 0xFF;
                        over[pos + 1] = marker;
                    }
                    cases.push(over);
                    let mut ins = good.clone();
                    ins.splice(pos..pos, [0xFF, marker]);
                    cases.push(ins);
                }
            }
            // Garbage between the data and EOI, and an extra FF before EOI.
            let n = good.len();
            let mut tail = good.clone();
            tail.splice(n - 2..n - 2, [0x12, 0x34]);
            cases.push(tail);
            let mut fill = good.clone();
            fill.splice(n - 2..n - 2, [0xFF]);
            cases.push(fill);
            for (i, bad) in cases.iter().enumerate() {
                let Some(frame) = parse_frame(bad) else {
                    continue;
                };
                let libjpeg = libjpeg_frame(bad).ok();
                let results = [
                    decode_sequential(bad, &frame),
                    decode_parallel(bad, &frame, 2),
                    decode_parallel(bad, &frame, 7),
                    decode_parallel_chunks(bad, &frame, 16, None),
                    decode_parallel_chunks(bad, &frame, 3, None),
                    decode_parallel_chunks(bad, &frame, 64, None),
                ];
                let seq_ok = results[0].is_ok();
                for (k, got) in results.into_iter().enumerate() {
                    // The parallel decodes prove the sequential decode's chain of blocks, so
                    // they decline exactly where it does.
                    assert_eq!(
                        got.is_ok(),
                        seq_ok,
                        "case {i}, decoder {k}: {:?}",
                        got.err()
                    );
                    outcomes[usize::from(got.is_ok())] += 1;
                    if let Ok(got) = got {
                        let (_, want) = libjpeg.as_ref().expect("we decode, libjpeg refuses");
                        if let Some(d) = first_diff(&frame, &got, want) {
                            panic!("case {i} ({grey}, {samp:?}, {restart:?}), decoder {k}: {d}");
                        }
                    }
                }
            }
        }
        eprintln!(
            "corrupted scans: {} decodes agreed with libjpeg, {} declined",
            outcomes[1], outcomes[0]
        );
        assert!(outcomes[0] > 100 && outcomes[1] > 50, "{outcomes:?}");
    }

    /// Hostile bytes in the header (every byte before the scan data, flipped three ways): no
    /// panic, and whatever our reading of the header lets us decode libjpeg decodes the same.
    #[test]
    fn corrupted_headers_decline_or_agree() {
        let (mut decoded, mut refused) = (0, 0);
        for good in [
            encode_with((48, 40), false, (2, 2), 75, true, (0, 0)),
            encode_with((40, 24), true, (1, 1), 90, false, (3, 0)),
        ] {
            let scan = parse_frame(&good).expect("frame").scan_start;
            for pos in 2..scan {
                for flip in [0x01u8, 0x10, 0x80] {
                    let mut bad = good.clone();
                    bad[pos] ^= flip;
                    let got = parse_frame(&bad).map(|f| (decode_sequential(&bad, &f), f));
                    let Some((Ok(got), frame)) = got else {
                        refused += 1;
                        continue;
                    };
                    let (theirs, want) = libjpeg_frame(&bad)
                        .unwrap_or_else(|e| panic!("byte {pos} ^ {flip:#x}: libjpeg: {e}"));
                    assert_same_geometry(&format!("byte {pos} ^ {flip:#x}"), &frame, &theirs);
                    if let Some(d) = first_diff(&frame, &got, &want) {
                        panic!("byte {pos} ^ {flip:#x}: {d}");
                    }
                    decoded += 1;
                }
            }
        }
        eprintln!("corrupted headers: {decoded} decodes agreed with libjpeg, {refused} declined");
        assert!(decoded > 100 && refused > 100, "{decoded} {refused}");
    }
}
