//! Malformed files made from the real writer's `tiny_v3.gguf` and `align64_v3.gguf` by
//! truncating or patching single fields: each must give the expected error variant.

use std::path::PathBuf;

use gguf_reader::{GgufError, GgufFile, MetaValue, MAX_ARRAY_DEPTH};

fn fixture(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/readers/gguf")
        .join(name);
    std::fs::read(path).expect("fixture")
}

fn tiny() -> Vec<u8> {
    fixture("tiny_v3.gguf")
}

fn parse(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
    GgufFile::from_bytes(bytes)
}

fn err(bytes: Vec<u8>) -> GgufError {
    parse(bytes).expect_err("malformed file parsed")
}

/// Offset just past the length-prefixed string `s` (a key or tensor name) in the header.
fn after(bytes: &[u8], s: &str) -> usize {
    let mut needle = (s.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(s.as_bytes());
    let hits: Vec<usize> = bytes
        .windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle.as_slice())
        .map(|(i, _)| i)
        .collect();
    assert_eq!(hits.len(), 1, "{s} found {} times", hits.len());
    hits[0] + needle.len()
}

/// Offset of the length prefix of the string `s`.
fn start_of(bytes: &[u8], s: &str) -> usize {
    after(bytes, s) - s.len() - 8
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Field offsets of one tensor info (tiny_v3's tensors: n_dims as written by gguf-py).
struct TensorFields {
    n_dims: usize,
    ne: usize,
    ggml_type: usize,
    offset: usize,
}

fn tensor_fields(b: &[u8], name: &str, n_dims: usize) -> TensorFields {
    let n = after(b, name);
    TensorFields {
        n_dims: n,
        ne: n + 4,
        ggml_type: n + 4 + 8 * n_dims,
        offset: n + 8 + 8 * n_dims,
    }
}

/// (name, n_dims) of tiny_v3's tensors, in file order.
const TINY_TENSORS: [(&str, usize); 5] = [
    ("v.position_embd.weight", 1),
    ("v.blk.0.attn_q.weight", 2),
    ("v.blk.0.ffn_up.weight", 3),
    ("v.blk.0.ffn_down.weight", 2),
    ("v.patch_embd.weight", 3),
];

/// End of the tensor-info table (the header's end, before alignment padding).
fn header_end(b: &[u8]) -> usize {
    let (name, n_dims) = TINY_TENSORS[4];
    tensor_fields(b, name, n_dims).offset + 8
}

#[test]
fn the_good_fixture_parses() {
    let f = parse(tiny()).unwrap();
    assert_eq!(f.tensors().len(), TINY_TENSORS.len());
}

#[test]
fn truncation_at_every_byte_fails_with_the_right_error() {
    let good = tiny();
    let f = parse(good.clone()).unwrap();
    let header_end = header_end(&good);
    let kv_end = start_of(&good, TINY_TENSORS[0].0);
    let data_end = f
        .tensors()
        .iter()
        .map(|t| f.data_offset() + t.offset + t.n_bytes)
        .max()
        .unwrap() as usize;
    assert!(header_end < f.data_offset() as usize && data_end <= good.len());
    for cut in 0..=good.len() {
        let r = parse(good[..cut].to_vec());
        match r {
            Err(GgufError::Truncated { .. }) if cut < header_end => {}
            Err(GgufError::CountTooLarge { .. }) if (24..header_end).contains(&cut) => {}
            Err(GgufError::TensorOutOfBounds { .. }) if (header_end..data_end).contains(&cut) => {}
            // gguf-py pads the last tensor to the alignment: cutting the padding loses nothing.
            Ok(_) if cut >= data_end => {}
            other => panic!("cut at {cut}: {other:?}"),
        }
    }
    // At the section boundaries, the exact error.
    let at = |cut: usize| err(good[..cut].to_vec());
    assert!(matches!(at(0), GgufError::Truncated { field: "magic", .. }));
    assert!(matches!(
        at(8),
        GgufError::Truncated {
            field: "tensor count",
            ..
        }
    ));
    assert!(matches!(
        at(24),
        GgufError::CountTooLarge {
            field: "metadata count",
            available: 0,
            ..
        }
    ));
    assert!(
        matches!(at(kv_end), GgufError::Truncated { ref location, field: "tensor name", .. } if location == "tensor info #0"),
        "{}",
        at(kv_end)
    );
    assert!(matches!(
        at(header_end),
        GgufError::TensorOutOfBounds { data_len: 0, .. }
    ));
    assert!(
        matches!(at(data_end - 1), GgufError::TensorOutOfBounds { ref tensor, .. } if tensor == "v.patch_embd.weight")
    );
}

#[test]
fn every_one_byte_corruption_of_the_header_is_handled() {
    // No expectation on which error: only that none panics and none allocates wildly.
    let good = tiny();
    for pos in 0..header_end(&good) {
        for v in [0x00, 0x01, 0x7f, 0x80, 0xff] {
            let mut b = good.clone();
            b[pos] = v;
            let _ = parse(b).map(|f| {
                for t in f.tensors() {
                    let _ = f.to_f32(t);
                }
            });
        }
    }
}

#[test]
fn lying_counts() {
    // A kv count of 2^60 with 100 bytes left fails on the count, before any allocation.
    let mut b = tiny()[..124].to_vec();
    put_u64(&mut b, 16, 1 << 60);
    assert!(matches!(
        err(b),
        GgufError::CountTooLarge { field: "metadata count", count, available: 100, .. } if count == 1 << 60
    ));
    let mut b = tiny();
    put_u64(&mut b, 16, u64::MAX);
    assert!(matches!(
        err(b),
        GgufError::CountTooLarge {
            field: "metadata count",
            ..
        }
    ));
    let mut b = tiny();
    put_u64(&mut b, 8, 1 << 60);
    assert!(matches!(
        err(b),
        GgufError::CountTooLarge {
            field: "tensor count",
            ..
        }
    ));
    // Counts that fit separately but not together.
    let mut b = tiny();
    let rest = (b.len() - 24) as u64;
    put_u64(&mut b, 16, rest / 13);
    put_u64(&mut b, 8, rest / 32);
    assert!(matches!(
        err(b),
        GgufError::CountTooLarge {
            field: "tensor count",
            ..
        }
    ));

    // One metadata entry fewer: the last entry's key is read as a tensor name and its value
    // type (i32 = 5) as n_dims.
    let mut b = tiny();
    let kv = get_u64(&b, 16);
    put_u64(&mut b, 16, kv - 1);
    assert!(matches!(
        err(b),
        GgufError::BadDims { ref tensor, n_dims: 5 } if tensor == "clip.vision.block_count"
    ));
    // One entry more, one tensor more: whatever follows is misread, and refused.
    let mut b = tiny();
    put_u64(&mut b, 16, kv + 1);
    assert!(parse(b).is_err());
    let mut b = tiny();
    let tc = get_u64(&b, 8);
    put_u64(&mut b, 8, tc + 1);
    assert!(parse(b).is_err());
}

#[test]
fn huge_and_lying_string_lengths() {
    let good = tiny();
    let first_key = 24;
    for (len, too_long) in [(1u64 << 40, true), (65_536, true), (60_000, false)] {
        let mut b = good.clone();
        put_u64(&mut b, first_key, len);
        match err(b) {
            GgufError::StringTooLong {
                field: "key",
                len: l,
                max: 65_535,
                ..
            } if too_long => {
                assert_eq!(l, len)
            }
            GgufError::Truncated { field: "key", .. } if !too_long => {}
            other => panic!("key length {len}: {other:?}"),
        }
    }
    let value_len = after(&good, "test.string") + 4;
    let mut b = good.clone();
    put_u64(&mut b, value_len, 1 << 40);
    assert!(matches!(
        err(b),
        GgufError::StringTooLong { ref location, field: "string value", .. } if location == "metadata key \"test.string\""
    ));
    let mut b = good.clone();
    put_u64(&mut b, value_len, 1 << 20);
    assert!(matches!(
        err(b),
        GgufError::Truncated {
            field: "string value",
            ..
        }
    ));

    let name_len = start_of(&good, "v.blk.0.attn_q.weight");
    let mut b = good.clone();
    put_u64(&mut b, name_len, 1 << 40);
    assert!(matches!(
        err(b),
        GgufError::StringTooLong { ref location, field: "tensor name", .. } if location == "tensor info #1"
    ));
}

#[test]
fn huge_array_lengths() {
    let good = tiny();
    for key in [
        "test.arr_u32",
        "test.arr_str",
        "test.nested",
        "test.arr_bool",
    ] {
        let count_at = after(&good, key) + 8;
        for count in [1u64 << 60, u64::MAX, 1 << 20] {
            let mut b = good.clone();
            put_u64(&mut b, count_at, count);
            match err(b) {
                GgufError::CountTooLarge {
                    field: "array length",
                    count: c,
                    ref location,
                    ..
                } => {
                    assert_eq!(c, count);
                    assert_eq!(location, &format!("metadata key {key:?}"));
                }
                other => panic!("{key} count {count}: {other:?}"),
            }
        }
    }
}

#[test]
fn bad_metadata_values() {
    let good = tiny();
    // Unknown value type.
    let mut b = good.clone();
    put_u32(&mut b, after(&good, "test.u8"), 13);
    assert!(matches!(err(b), GgufError::UnknownValueType { id: 13, .. }));
    // Unknown array element type.
    let mut b = good.clone();
    put_u32(&mut b, after(&good, "test.arr_u32") + 4, 99);
    assert!(matches!(err(b), GgufError::UnknownValueType { id: 99, .. }));
    // A bool that is neither 0 nor 1.
    let mut b = good.clone();
    b[after(&good, "test.bool") + 4] = 2;
    assert!(matches!(err(b), GgufError::InvalidBool { byte: 2, .. }));
    let mut b = good.clone();
    b[after(&good, "test.arr_bool") + 16] = 7;
    assert!(matches!(err(b), GgufError::InvalidBool { byte: 7, .. }));
    // A key that is not UTF-8.
    let mut b = good.clone();
    b[start_of(&good, "test.u8") + 8] = 0xff;
    assert!(matches!(
        err(b),
        GgufError::InvalidUtf8 { field: "key", .. }
    ));
    // A string value that is not UTF-8 is decoded lossily.
    let mut b = good.clone();
    b[after(&good, "test.string") + 12] = 0xff;
    let f = parse(b).unwrap();
    assert_eq!(
        f.get_str("test.string").unwrap(),
        "\u{fffd}\u{e9}llo w\u{f6}rld \u{2713}"
    );
    // Duplicate key: "test.i8" renamed "test.u8".
    let mut b = good.clone();
    b[start_of(&good, "test.i8") + 8 + 5] = b'u';
    assert!(matches!(err(b), GgufError::DuplicateKey { key } if key == "test.u8"));
}

/// A v3 file with no tensors and one key `deep`: `depth` arrays nested, a u8 inside.
fn nested_file(depth: usize) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
    b.extend_from_slice(&4u64.to_le_bytes());
    b.extend_from_slice(b"deep");
    b.extend_from_slice(&9u32.to_le_bytes()); // array
    for level in 1..=depth {
        let elem: u32 = if level == depth { 0 } else { 9 };
        b.extend_from_slice(&elem.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
    }
    b.push(42);
    b
}

#[test]
fn array_nesting_is_capped() {
    let f = parse(nested_file(MAX_ARRAY_DEPTH)).unwrap();
    let mut v = f.get("deep").unwrap().clone();
    for _ in 0..MAX_ARRAY_DEPTH {
        v = v.as_array().unwrap().get(0).unwrap().clone();
    }
    assert_eq!(v, MetaValue::U8(42));
    assert!(matches!(
        err(nested_file(MAX_ARRAY_DEPTH + 1)),
        GgufError::NestingTooDeep {
            max: MAX_ARRAY_DEPTH,
            ..
        }
    ));
    // 10k nesting levels claimed: refused at level 9, not by exhausting the stack.
    assert!(matches!(
        err(nested_file(10_000)),
        GgufError::NestingTooDeep { .. }
    ));
}

#[test]
fn bad_alignment_values() {
    let good = fixture("align64_v3.gguf");
    assert_eq!(parse(good.clone()).unwrap().alignment(), 64);
    let ty = after(&good, "general.alignment");
    for (v, found) in [(0u32, "0"), (3, "3"), (96, "96")] {
        let mut b = good.clone();
        put_u32(&mut b, ty + 4, v);
        assert!(matches!(err(b), GgufError::BadAlignment { found: f } if f == found));
    }
    let mut b = good.clone();
    put_u32(&mut b, ty, 5); // i32 instead of u32, same size
    assert!(matches!(err(b), GgufError::BadAlignment { found } if found == "a i32 value"));
    let mut b = good.clone();
    put_u32(&mut b, ty, 6); // f32
    assert!(matches!(err(b), GgufError::BadAlignment { found } if found == "a f32 value"));
}

#[test]
fn bad_tensor_offsets() {
    let good = tiny();
    let field = |i: usize| tensor_fields(&good, TINY_TENSORS[i].0, TINY_TENSORS[i].1);
    let offset_of = |i: usize| get_u64(&good, field(i).offset);

    // Not a multiple of the alignment.
    let mut b = good.clone();
    put_u64(&mut b, field(2).offset, offset_of(2) + 4);
    let e = err(b);
    assert!(
        matches!(&e, GgufError::MisalignedOffset { tensor, alignment: 32, .. } if tensor == TINY_TENSORS[2].0)
    );
    assert!(e.to_string().contains("v.blk.0.ffn_up.weight"));

    // Overlapping: same start, and start inside another tensor.
    for new in [offset_of(0), offset_of(0) + 32, offset_of(3)] {
        let mut b = good.clone();
        put_u64(&mut b, field(1).offset, new);
        assert!(
            matches!(err(b), GgufError::OverlappingTensors { .. }),
            "offset {new}"
        );
    }
    // Abutting is fine: the second tensor moved to the first one's end (256 bytes).
    let mut b = good.clone();
    put_u64(&mut b, field(1).offset, offset_of(1));
    assert!(parse(b).is_ok());

    // Out of bounds: past the end, wrapping around, and growing a tensor past the end.
    for new in [1 << 20, u64::MAX - 31] {
        let mut b = good.clone();
        put_u64(&mut b, field(4).offset, new);
        assert!(
            matches!(err(b), GgufError::TensorOutOfBounds { ref tensor, .. } if tensor == TINY_TENSORS[4].0)
        );
    }
    let mut b = good.clone();
    put_u64(&mut b, field(4).ne, 1024);
    assert!(matches!(err(b), GgufError::TensorOutOfBounds { .. }));
}

#[test]
fn bad_tensor_shapes_and_types() {
    let good = tiny();
    let field = |i: usize| tensor_fields(&good, TINY_TENSORS[i].0, TINY_TENSORS[i].1);

    for n_dims in [0u32, 5, u32::MAX] {
        let mut b = good.clone();
        put_u32(&mut b, field(1).n_dims, n_dims);
        assert!(matches!(
            err(b),
            GgufError::BadDims { ref tensor, n_dims: n } if n == n_dims && tensor == TINY_TENSORS[1].0
        ));
    }
    // Element count overflow: 2^32 * 2^32, and 2^62 * 2 (past i64::MAX, ggml's limit).
    for (ne0, ne1) in [(1u64 << 32, 1u64 << 32), (1 << 62, 2), (u64::MAX, 1)] {
        let mut b = good.clone();
        put_u64(&mut b, field(1).ne, ne0);
        put_u64(&mut b, field(1).ne + 8, ne1);
        assert!(
            matches!(err(b), GgufError::ElementCountOverflow { .. }),
            "{ne0} x {ne1}"
        );
    }
    // Byte count overflow: 2^63 - 32 Q8_0 elements fit in i64, their 34/32 as many bytes do not.
    let mut b = good.clone();
    put_u64(&mut b, field(3).ne, (1 << 63) - 32);
    put_u64(&mut b, field(3).ne + 8, 1);
    assert!(matches!(err(b), GgufError::ElementCountOverflow { .. }));
    // Rows not a whole number of Q8_0 blocks.
    let mut b = good.clone();
    put_u64(&mut b, field(3).ne, 48);
    assert!(matches!(
        err(b),
        GgufError::NotBlockMultiple {
            ne0: 48,
            block_size: 32,
            ..
        }
    ));
    // Unknown ggml type ids: retired (4, 31) and never defined.
    for id in [4u32, 31, 42, 1000] {
        let mut b = good.clone();
        put_u32(&mut b, field(0).ggml_type, id);
        assert!(matches!(err(b), GgufError::UnknownGgmlType { id: i, .. } if i == id));
    }
    // Duplicate tensor name: "v.blk.0.ffn_up.weight" renamed "v.blk.0.attn_q.weight".
    let mut b = good.clone();
    let at = start_of(&good, TINY_TENSORS[2].0) + 8 + "v.blk.0.".len();
    b[at..at + 6].copy_from_slice(b"attn_q");
    assert!(matches!(err(b), GgufError::DuplicateTensor { name } if name == TINY_TENSORS[1].0));
    // A tensor name that is not UTF-8.
    let mut b = good.clone();
    b[start_of(&good, TINY_TENSORS[0].0) + 8] = 0xc0;
    assert!(matches!(
        err(b),
        GgufError::InvalidUtf8 {
            field: "tensor name",
            ..
        }
    ));
}

#[test]
fn bad_magic_and_versions() {
    let good = tiny();
    let mut b = good.clone();
    b[..4].copy_from_slice(b"GGML");
    assert!(matches!(err(b), GgufError::BadMagic { found } if found == b"GGML"));
    assert!(matches!(err(b"GX".to_vec()), GgufError::BadMagic { .. }));
    assert!(matches!(
        err(b"GG".to_vec()),
        GgufError::Truncated { field: "magic", .. }
    ));
    assert!(matches!(err(Vec::new()), GgufError::Truncated { .. }));
    for v in [0u32, 1, 4, 0xffff_ffff] {
        let mut b = good.clone();
        put_u32(&mut b, 4, v);
        assert!(matches!(err(b), GgufError::UnsupportedVersion { version } if version == v));
    }
    let mut b = good.clone();
    put_u32(&mut b, 4, 3u32.swap_bytes());
    assert!(matches!(err(b), GgufError::BigEndian { .. }));
}

#[test]
fn a_file_with_only_metadata_needs_no_data_section() {
    // Written up to the end of its metadata, no padding: still a valid file.
    let f = parse(nested_file(1)).unwrap();
    assert!(f.tensors().is_empty());
    assert_eq!(f.alignment(), 32);
}
