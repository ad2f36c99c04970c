//! Opening a checkpoint (single file, model directory or sharded index) and looking tensors up.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::io::Read;
use std::ops::Deref;
use std::path::{Component, Path, PathBuf};

use memmap2::Mmap;
use serde_json::Value;

use crate::header::{self, Header};
use crate::{StError, TensorInfo, TensorView};

/// transformers `SAFE_WEIGHTS_NAME`: the single-file checkpoint in a model directory.
pub const SAFE_WEIGHTS_NAME: &str = "model.safetensors";
/// transformers `SAFE_WEIGHTS_INDEX_NAME`: the shard index in a model directory.
pub const SAFE_WEIGHTS_INDEX_NAME: &str = "model.safetensors.index.json";
/// Cap on each JSON side file read eagerly at open (`config.json` and friends, the index).
pub const CONFIG_MAX_BYTES: u64 = 16 << 20;
/// Cap on `tokenizer.json`, read only on demand by [`Checkpoint::tokenizer_json`].
pub const TOKENIZER_JSON_MAX_BYTES: u64 = 128 << 20;
/// Name used for the one "file" of a checkpoint made by [`Checkpoint::from_bytes`].
pub const MEMORY_FILE_NAME: &str = "<memory>";

/// The bytes of one shard: memory-mapped, or owned.
enum Buffer {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl Deref for Buffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Buffer::Mapped(m) => m,
            Buffer::Owned(v) => v,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Load {
    Map,
    Read,
}

/// What a path resolves to.
enum Layout {
    Single(PathBuf),
    Index(PathBuf),
}

/// JSON side files read eagerly at open.
#[derive(Debug, Default)]
struct Configs {
    config: Option<Value>,
    preprocessor: Option<Value>,
    processor: Option<Value>,
    tokenizer: Option<Value>,
}

/// An open safetensors checkpoint: every tensor header validated, the data memory-mapped (or
/// held in memory), and the model directory's JSON configs parsed.
pub struct Checkpoint {
    root: PathBuf,
    shard_paths: Vec<PathBuf>,
    buffers: Vec<Buffer>,
    /// Sorted by name.
    tensors: Vec<TensorInfo>,
    metadata: BTreeMap<String, String>,
    index: Option<Value>,
    configs: Configs,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("root", &self.root)
            .field("shard_paths", &self.shard_paths)
            .field("tensors", &self.tensors.len())
            .field("metadata", &self.metadata)
            .finish_non_exhaustive()
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> StError + '_ {
    move |source| StError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// True when `name` is one plain file name: not empty, `.`, `..`, absolute, and without path
/// separators (either kind) or NUL.
fn is_plain_file_name(name: &str) -> bool {
    !name.contains(['/', '\\', '\0'])
        && matches!(
            Path::new(name).components().collect::<Vec<_>>().as_slice(),
            [Component::Normal(_)]
        )
}

/// Reads a whole file of at most `cap` bytes; `Ok(None)` when it does not exist.
fn read_capped(path: &Path, cap: u64) -> Result<Option<Vec<u8>>, StError> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(path)(e)),
    };
    let mut buf = Vec::new();
    file.take(cap + 1)
        .read_to_end(&mut buf)
        .map_err(io_err(path))?;
    if buf.len() as u64 > cap {
        let size = std::fs::metadata(path).map_or(buf.len() as u64, |m| m.len());
        return Err(StError::FileTooLarge {
            path: path.to_path_buf(),
            size,
            limit: cap,
        });
    }
    Ok(Some(buf))
}

/// Reads and parses a JSON file of at most `cap` bytes; `Ok(None)` when it does not exist.
fn read_json(path: &Path, cap: u64) -> Result<Option<Value>, StError> {
    let Some(bytes) = read_capped(path, cap)? else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|source| StError::InvalidJson {
            path: path.to_path_buf(),
            source,
        })
}

fn load(path: &Path, how: Load) -> Result<Buffer, StError> {
    let file = File::open(path).map_err(io_err(path))?;
    let len = file.metadata().map_err(io_err(path))?.len();
    if how == Load::Read || len < header::PREFIX_LEN as u64 {
        // Too short to map usefully; the header parser reports it.
        let mut v = Vec::new();
        (&file).read_to_end(&mut v).map_err(io_err(path))?;
        return Ok(Buffer::Owned(v));
    }
    // SAFETY: the map is read-only and private, and `Checkpoint` only ever reads it. What Rust
    // cannot rule out is another process truncating or rewriting the file while it is mapped
    // (SIGBUS or torn reads); `Checkpoint::open` documents that callers must not let that
    // happen, the same contract safetensors and candle place on their mmap loaders.
    let map = unsafe { Mmap::map(&file) }.map_err(io_err(path))?;
    Ok(Buffer::Mapped(map))
}

fn resolve_dir(dir: &Path) -> Result<Layout, StError> {
    // transformers' preference order: model.safetensors, then the index.
    let single = dir.join(SAFE_WEIGHTS_NAME);
    if single.is_file() {
        return Ok(Layout::Single(single));
    }
    let index = dir.join(SAFE_WEIGHTS_INDEX_NAME);
    if index.is_file() {
        return Ok(Layout::Index(index));
    }
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        let name = entry.file_name();
        if let Some(name) = name.to_str() {
            if name.ends_with(".safetensors") && entry.path().is_file() {
                found.push(name.to_owned());
            }
        }
    }
    found.sort();
    match found.as_slice() {
        [] => Err(StError::NoCheckpoint { dir: dir.into() }),
        [one] => Ok(Layout::Single(dir.join(one))),
        _ => Err(StError::AmbiguousDirectory {
            dir: dir.into(),
            files: found,
        }),
    }
}

/// Turns one validated header into `TensorInfo`s for shard `shard`.
fn infos(header: Header, shard: usize) -> (Vec<TensorInfo>, BTreeMap<String, String>) {
    let start = header.data_start;
    let tensors = header
        .tensors
        .into_iter()
        .map(|t| TensorInfo {
            file_range: start + t.data_offsets.0..start + t.data_offsets.1,
            name: t.name,
            dtype: t.dtype,
            shape: t.shape,
            shard,
            data_offsets: t.data_offsets,
        })
        .collect();
    (tensors, header.metadata)
}

impl Checkpoint {
    /// Opens a checkpoint, memory-mapping each `.safetensors` file.
    ///
    /// `path` may be: a `.safetensors` file; a `*.index.json` shard index; or a directory,
    /// where `model.safetensors` is preferred, then `model.safetensors.index.json`, then a lone
    /// `*.safetensors` file (several without an index is [`StError::AmbiguousDirectory`]).
    /// The JSON configs (`config.json`, `preprocessor_config.json`, `processor_config.json`,
    /// `tokenizer_config.json`) are read from the directory (beside a file path) when present.
    ///
    /// Every header is validated as the safetensors crate does, and a sharded checkpoint's
    /// shards must hold exactly the tensors its `weight_map` routes to them.
    ///
    /// **Contract:** the files must not be modified or truncated while the checkpoint is open;
    /// the maps would change underneath (or the process get SIGBUS). Use
    /// [`Checkpoint::open_in_memory`] where that cannot be promised. Symlinks are followed
    /// (the Hugging Face cache links snapshot files to blobs elsewhere).
    pub fn open(path: impl AsRef<Path>) -> Result<Checkpoint, StError> {
        Self::open_as(path.as_ref(), Load::Map)
    }

    /// Like [`Checkpoint::open`] but reads every file into memory instead of mapping it.
    pub fn open_in_memory(path: impl AsRef<Path>) -> Result<Checkpoint, StError> {
        Self::open_as(path.as_ref(), Load::Read)
    }

    /// Parses one whole safetensors file held in memory (no directory, so no configs); its
    /// file name in errors and [`Checkpoint::shard_paths`] is [`MEMORY_FILE_NAME`].
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Checkpoint, StError> {
        let name = PathBuf::from(MEMORY_FILE_NAME);
        let header = header::parse(&bytes, &name)?;
        let (mut tensors, metadata) = infos(header, 0);
        tensors.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Checkpoint {
            root: PathBuf::new(),
            shard_paths: vec![name],
            buffers: vec![Buffer::Owned(bytes)],
            tensors,
            metadata,
            index: None,
            configs: Configs::default(),
        })
    }

    fn open_as(path: &Path, how: Load) -> Result<Checkpoint, StError> {
        let meta = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(StError::NotFound { path: path.into() })
            }
            Err(e) => return Err(io_err(path)(e)),
        };
        let (root, layout) = if meta.is_dir() {
            (path.to_path_buf(), resolve_dir(path)?)
        } else {
            let root = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            };
            let is_index = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(".index.json"));
            let layout = if is_index {
                Layout::Index(path.into())
            } else {
                Layout::Single(path.into())
            };
            (root, layout)
        };
        let mut ckpt = match layout {
            Layout::Single(file) => {
                let buffer = load(&file, how)?;
                let header = header::parse(&buffer, &file)?;
                let (mut tensors, metadata) = infos(header, 0);
                tensors.sort_by(|a, b| a.name.cmp(&b.name));
                Checkpoint {
                    root,
                    shard_paths: vec![file],
                    buffers: vec![buffer],
                    tensors,
                    metadata,
                    index: None,
                    configs: Configs::default(),
                }
            }
            Layout::Index(index) => Self::open_sharded(root, &index, how)?,
        };
        let json = |name: &str| read_json(&ckpt.root.join(name), CONFIG_MAX_BYTES);
        ckpt.configs = Configs {
            config: json("config.json")?,
            preprocessor: json("preprocessor_config.json")?,
            processor: json("processor_config.json")?,
            tokenizer: json("tokenizer_config.json")?,
        };
        Ok(ckpt)
    }

    fn open_sharded(root: PathBuf, index_path: &Path, how: Load) -> Result<Checkpoint, StError> {
        let invalid = |reason: &str| StError::InvalidIndex {
            path: index_path.into(),
            reason: reason.into(),
        };
        let index = read_json(index_path, CONFIG_MAX_BYTES)?.ok_or_else(|| StError::NotFound {
            path: index_path.into(),
        })?;
        let Some(map) = index.get("weight_map").and_then(Value::as_object) else {
            return Err(invalid("no `weight_map` object"));
        };
        let mut weight_map: HashMap<&str, &str> = HashMap::with_capacity(map.len());
        for (tensor, shard) in map {
            let shard = shard.as_str().ok_or_else(|| {
                invalid(&format!("weight_map value for `{tensor}` is not a string"))
            })?;
            weight_map.insert(tensor, shard);
        }
        // Shards in name order (model-00001-of-0000n.safetensors, ...).
        let shard_names: Vec<&str> = weight_map
            .values()
            .copied()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut shard_paths = Vec::with_capacity(shard_names.len());
        let mut buffers = Vec::with_capacity(shard_names.len());
        let mut tensors = Vec::with_capacity(weight_map.len());
        let mut metadata = BTreeMap::new();
        for (i, name) in shard_names.iter().enumerate() {
            if !is_plain_file_name(name) {
                return Err(StError::UnsafeFileName {
                    index: index_path.into(),
                    name: (*name).to_owned(),
                });
            }
            let path = root.join(name);
            if !path.is_file() {
                return Err(StError::MissingShard {
                    index: index_path.into(),
                    shard: (*name).to_owned(),
                });
            }
            let buffer = load(&path, how)?;
            let header = header::parse(&buffer, &path)?;
            let (shard_tensors, shard_meta) = infos(header, i);
            tensors.extend(shard_tensors);
            // Merge `__metadata__`; on conflicting values the earlier shard wins.
            for (k, v) in shard_meta {
                metadata.entry(k).or_insert(v);
            }
            shard_paths.push(path);
            buffers.push(buffer);
        }
        tensors.sort_by(|a, b| a.name.cmp(&b.name).then(a.shard.cmp(&b.shard)));
        let shard_of = |t: &TensorInfo| shard_names.get(t.shard).copied().unwrap_or_default();
        for pair in tensors.windows(2) {
            if let [a, b] = pair {
                if a.name == b.name {
                    return Err(StError::TensorInTwoShards {
                        tensor: a.name.clone(),
                        first: shard_of(a).to_owned(),
                        second: shard_of(b).to_owned(),
                    });
                }
            }
        }
        for t in &tensors {
            let Some(&routed) = weight_map.get(t.name.as_str()) else {
                return Err(StError::TensorNotInIndex {
                    tensor: t.name.clone(),
                    shard: shard_of(t).to_owned(),
                });
            };
            if routed != shard_of(t) {
                return Err(StError::TensorNotInShard {
                    tensor: t.name.clone(),
                    expected: routed.to_owned(),
                    found: Some(shard_of(t).to_owned()),
                });
            }
        }
        if tensors.len() != weight_map.len() {
            let mut missing: Vec<(&str, &str)> = weight_map
                .iter()
                .filter(|(name, _)| {
                    tensors
                        .binary_search_by(|t| t.name.as_str().cmp(name))
                        .is_err()
                })
                .map(|(n, s)| (*n, *s))
                .collect();
            missing.sort();
            if let Some((tensor, shard)) = missing.first() {
                return Err(StError::TensorNotInShard {
                    tensor: (*tensor).to_owned(),
                    expected: (*shard).to_owned(),
                    found: None,
                });
            }
        }
        Ok(Checkpoint {
            root,
            shard_paths,
            buffers,
            tensors,
            metadata,
            index: Some(index),
            configs: Configs::default(),
        })
    }

    /// Every tensor, sorted by name (`.as_slice()` gives them as a slice).
    pub fn tensors(&self) -> std::slice::Iter<'_, TensorInfo> {
        self.tensors.iter()
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether the checkpoint holds no tensor.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// The description of the tensor with exactly this name.
    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors
            .binary_search_by(|t| t.name.as_str().cmp(name))
            .ok()
            .and_then(|i| self.tensors.get(i))
    }

    /// The tensor with exactly this name (no prefix tolerance; see [`Checkpoint::find`]).
    pub fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        self.info(name).and_then(|info| self.view(info))
    }

    fn view<'a>(&'a self, info: &'a TensorInfo) -> Option<TensorView<'a>> {
        let data = self.buffers.get(info.shard)?.get(info.file_range.clone())?;
        Some(TensorView::new(info, data))
    }

    /// Converts a BF16, F16 or F32 tensor to `f32` ([`TensorView::to_f32`]).
    pub fn to_f32(&self, view: &TensorView<'_>) -> Result<Vec<f32>, StError> {
        view.to_f32()
    }

    /// Converts a BF16, F16 or F32 tensor to `bf16`, rounding to nearest-even
    /// ([`TensorView::to_bf16`]).
    pub fn to_bf16(&self, view: &TensorView<'_>) -> Result<Vec<half::bf16>, StError> {
        view.to_bf16()
    }

    /// Looks a tensor up tolerating the `model.` prefix that releases add or drop.
    ///
    /// Tries `name`, then `model.{name}`, then `name` without a leading `model.`. Exactly one
    /// of these may exist: none is [`StError::TensorNotFound`], and more than one (say both
    /// `vision_model.x` and `model.vision_model.x`) is [`StError::AmbiguousName`] rather than a
    /// silent preference, since the two may hold different weights. Use
    /// [`Checkpoint::tensor`] to ask for one exact spelling.
    pub fn find(&self, name: &str) -> Result<TensorView<'_>, StError> {
        let mut tried = vec![name.to_owned(), format!("model.{name}")];
        if let Some(stripped) = name.strip_prefix("model.") {
            tried.push(stripped.to_owned());
        }
        self.find_among(name, tried)
    }

    /// Looks up `{prefix}{suffix}` for each prefix (e.g. `["vision_model.",
    /// "model.vision_model.", "vision_tower."]`); exactly one spelling may exist, with the same
    /// errors as [`Checkpoint::find`].
    pub fn find_with_prefixes(
        &self,
        prefixes: &[&str],
        suffix: &str,
    ) -> Result<TensorView<'_>, StError> {
        let tried = prefixes.iter().map(|p| format!("{p}{suffix}")).collect();
        self.find_among(suffix, tried)
    }

    fn find_among(&self, name: &str, mut tried: Vec<String>) -> Result<TensorView<'_>, StError> {
        let mut seen = BTreeSet::new();
        tried.retain(|t| seen.insert(t.clone()));
        let found: Vec<&TensorInfo> = tried.iter().filter_map(|t| self.info(t)).collect();
        match found.as_slice() {
            [one] => self.view(one).ok_or_else(|| StError::TensorNotFound {
                name: name.to_owned(),
                tried,
            }),
            [] => Err(StError::TensorNotFound {
                name: name.to_owned(),
                tried,
            }),
            many => {
                let mut candidates: Vec<String> = many.iter().map(|t| t.name.clone()).collect();
                candidates.sort();
                Err(StError::AmbiguousName {
                    name: name.to_owned(),
                    candidates,
                })
            }
        }
    }

    /// The `__metadata__` string map, merged across shards (on a conflicting key the first
    /// shard in [`Checkpoint::shard_paths`] order wins).
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// The parsed shard index (`model.safetensors.index.json`), for sharded checkpoints.
    pub fn index(&self) -> Option<&Value> {
        self.index.as_ref()
    }

    /// The model directory (the file's directory for a single-file path; empty for
    /// [`Checkpoint::from_bytes`]).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The `.safetensors` files, in shard order ([`TensorInfo::shard`] indexes this).
    pub fn shard_paths(&self) -> &[PathBuf] {
        &self.shard_paths
    }

    /// `config.json`, when the directory has one.
    pub fn config(&self) -> Option<&Value> {
        self.configs.config.as_ref()
    }

    /// `preprocessor_config.json`, when the directory has one.
    pub fn preprocessor_config(&self) -> Option<&Value> {
        self.configs.preprocessor.as_ref()
    }

    /// `processor_config.json`, when the directory has one.
    pub fn processor_config(&self) -> Option<&Value> {
        self.configs.processor.as_ref()
    }

    /// `tokenizer_config.json`, when the directory has one.
    pub fn tokenizer_config(&self) -> Option<&Value> {
        self.configs.tokenizer.as_ref()
    }

    /// Reads and parses `tokenizer.json` now (it is not read at open: it can be tens of MB),
    /// refusing files above [`TOKENIZER_JSON_MAX_BYTES`]. `Ok(None)` when absent.
    pub fn tokenizer_json(&self) -> Result<Option<Value>, StError> {
        self.json_file("tokenizer.json", TOKENIZER_JSON_MAX_BYTES)
    }

    /// Reads and parses another JSON file of the model directory on demand (e.g.
    /// `generation_config.json`), refusing files above `max_bytes`. `Ok(None)` when absent or
    /// for a checkpoint made by [`Checkpoint::from_bytes`]; `name` must be a plain file name.
    pub fn json_file(&self, name: &str, max_bytes: u64) -> Result<Option<Value>, StError> {
        if !is_plain_file_name(name) {
            return Err(StError::UnsafeFileName {
                index: self.root.clone(),
                name: name.to_owned(),
            });
        }
        if self.root.as_os_str().is_empty() {
            return Ok(None);
        }
        read_json(&self.root.join(name), max_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{expected_file, fixtures, unhex, Scratch};
    use crate::Dtype;
    use serde_json::json;

    /// Asserts that `ckpt` holds exactly the tensors the writer recorded for `rel`, shard `shard`.
    fn check_against_writer(ckpt: &Checkpoint, rel: &str, shard: usize) {
        let exp = expected_file(rel);
        for (name, e) in exp["tensors"].as_object().unwrap() {
            let info = ckpt.info(name).unwrap_or_else(|| panic!("{name} missing"));
            assert_eq!(info.dtype.as_str(), e["dtype"]);
            assert_eq!(json!(info.shape), e["shape"]);
            assert_eq!(
                json!([info.data_offsets.0, info.data_offsets.1]),
                e["data_offsets"]
            );
            assert_eq!(info.shard, shard);
            assert_eq!(
                info.file_range.start,
                8 + exp["header_len"].as_u64().unwrap() as usize + info.data_offsets.0
            );
            assert_eq!(
                ckpt.tensor(name).unwrap().bytes(),
                unhex(e["raw_hex"].as_str().unwrap())
            );
        }
    }

    #[test]
    fn single_file() {
        let path = fixtures().join("single.safetensors");
        for ckpt in [
            Checkpoint::open(&path).unwrap(),
            Checkpoint::open_in_memory(&path).unwrap(),
            Checkpoint::from_bytes(std::fs::read(&path).unwrap()).unwrap(),
        ] {
            check_against_writer(&ckpt, "single.safetensors", 0);
            let names: Vec<&str> = ckpt.tensors().map(|t| t.name.as_str()).collect();
            assert_eq!(names, ["bf16", "f16", "f32", "i64", "u8"]);
            assert_eq!(
                json!(ckpt.metadata()),
                expected_file("single.safetensors")["metadata"]
            );
            assert!(ckpt.config().is_none() && ckpt.index().is_none());
            assert_eq!(ckpt.shard_paths().len(), 1);
        }
        let ckpt = Checkpoint::open(&path).unwrap();
        assert_eq!(ckpt.root(), fixtures());
        assert_eq!(ckpt.shard_paths(), [path]);
        let mem =
            Checkpoint::from_bytes(std::fs::read(fixtures().join("single.safetensors")).unwrap())
                .unwrap();
        assert_eq!(mem.root(), Path::new(""));
        assert_eq!(mem.shard_paths(), [PathBuf::from(MEMORY_FILE_NAME)]);
        assert!(mem.tokenizer_json().unwrap().is_none());
    }

    #[test]
    fn model_directory_with_configs() {
        let dir = fixtures().join("model_dir");
        let ckpt = Checkpoint::open(&dir).unwrap();
        check_against_writer(&ckpt, "model_dir/model.safetensors", 0);
        assert_eq!(ckpt.root(), dir);
        assert_eq!(ckpt.shard_paths(), [dir.join("model.safetensors")]);
        assert_eq!(ckpt.config().unwrap()["hidden_size"], 2);
        assert_eq!(ckpt.preprocessor_config().unwrap()["size"]["height"], 4);
        assert!(ckpt.processor_config().is_none() && ckpt.tokenizer_config().is_none());
        assert!(ckpt.tokenizer_json().unwrap().is_none());
        // A file path finds its directory's configs too.
        let by_file = Checkpoint::open(dir.join("model.safetensors")).unwrap();
        assert_eq!(by_file.config(), ckpt.config());
        let w = by_file
            .find("model.vision_model.embeddings.patch_embedding.weight")
            .unwrap();
        assert_eq!(w.dtype(), &Dtype::BF16);
    }

    #[test]
    fn sharded_directory() {
        let dir = fixtures().join("sharded");
        let ckpt = Checkpoint::open(&dir).unwrap();
        let index = expected_file("sharded/model.safetensors.index.json");
        let shards = [
            "model-00001-of-00003.safetensors",
            "model-00002-of-00003.safetensors",
            "model-00003-of-00003.safetensors",
        ];
        assert_eq!(ckpt.shard_paths(), shards.map(|s| dir.join(s)));
        for (i, s) in shards.iter().enumerate() {
            check_against_writer(&ckpt, &format!("sharded/{s}"), i);
        }
        let routed: BTreeMap<&str, &str> = ckpt
            .tensors()
            .map(|t| (t.name.as_str(), shards[t.shard]))
            .collect();
        assert_eq!(json!(routed), index["weight_map"]);
        assert_eq!(
            ckpt.index().unwrap()["metadata"]["total_size"],
            index["total_size"]
        );
        assert_eq!(
            ckpt.metadata().get("format").map(String::as_str),
            Some("pt")
        );
        assert_eq!(ckpt.config().unwrap()["model_type"], "tiny_vlm");
        assert_eq!(ckpt.processor_config().unwrap()["image_seq_length"], 4);
        assert_eq!(
            ckpt.tokenizer_config().unwrap()["added_tokens_decoder"]["7"]["content"],
            "<image>"
        );
        assert_eq!(
            ckpt.tokenizer_json().unwrap().unwrap()["added_tokens"][0]["id"],
            7
        );
        assert!(matches!(
            ckpt.json_file("tokenizer.json", 10),
            Err(StError::FileTooLarge { limit: 10, .. })
        ));
        assert!(matches!(
            ckpt.json_file("../config.json", 1 << 20),
            Err(StError::UnsafeFileName { .. })
        ));
        // The index file itself opens the same checkpoint.
        let via_index = Checkpoint::open(dir.join(SAFE_WEIGHTS_INDEX_NAME)).unwrap();
        assert_eq!(via_index.tensors().as_slice(), ckpt.tensors().as_slice());
        let mem = Checkpoint::open_in_memory(&dir).unwrap();
        assert_eq!(
            mem.tensor("model.language_model.norm.weight")
                .unwrap()
                .to_f32()
                .unwrap(),
            [1.0, 1.0]
        );
    }

    #[test]
    fn find_tolerates_model_prefix() {
        let ckpt = Checkpoint::open(fixtures().join("sharded")).unwrap();
        // Stored as vision_model.*: found with and without an extra `model.`.
        for name in [
            "vision_model.encoder.layers.0.mlp.fc1.weight",
            "model.vision_model.encoder.layers.0.mlp.fc1.weight",
        ] {
            let v = ckpt.find(name).unwrap();
            assert_eq!(v.name(), "vision_model.encoder.layers.0.mlp.fc1.weight");
            assert_eq!(v.to_f32().unwrap(), [1.5, -2.0, 0.125, 3.0]);
        }
        // Stored as model.*: found without it.
        assert_eq!(
            ckpt.find("language_model.norm.weight").unwrap().name(),
            "model.language_model.norm.weight"
        );
        assert!(ckpt.tensor("language_model.norm.weight").is_none());
        match ckpt.find("vision_model.nope") {
            Err(StError::TensorNotFound { name, tried }) => {
                assert_eq!(name, "vision_model.nope");
                assert_eq!(tried, ["vision_model.nope", "model.vision_model.nope"]);
            }
            other => panic!("{other:?}"),
        }
        let v = ckpt
            .find_with_prefixes(
                &["vision_tower.", "model.vision_model.", "vision_model."],
                "embeddings.position_embedding.weight",
            )
            .unwrap();
        assert_eq!(v.to_f32().unwrap(), [0.25, -0.25, 2.0, -4.0]);
    }

    #[test]
    fn find_refuses_ambiguous_spellings() {
        let ckpt = Checkpoint::open(fixtures().join("ambiguous.safetensors")).unwrap();
        for name in ["vision_model.head.weight", "model.vision_model.head.weight"] {
            match ckpt.find(name) {
                Err(StError::AmbiguousName { candidates, .. }) => assert_eq!(
                    candidates,
                    ["model.vision_model.head.weight", "vision_model.head.weight"]
                ),
                other => panic!("{other:?}"),
            }
            assert!(ckpt.tensor(name).is_some());
        }
        assert!(matches!(
            ckpt.find_with_prefixes(&["model.", ""], "vision_model.head.weight"),
            Err(StError::AmbiguousName { .. })
        ));
        assert_eq!(
            ckpt.find_with_prefixes(&["model."], "vision_model.head.weight")
                .unwrap()
                .to_f32()
                .unwrap(),
            [2.0]
        );
    }

    #[test]
    fn directory_resolution() {
        let lone = Checkpoint::open(fixtures().join("lone_dir")).unwrap();
        assert_eq!(
            lone.shard_paths(),
            [fixtures().join("lone_dir/weights.safetensors")]
        );
        assert_eq!(lone.tensor("w").unwrap().to_f32().unwrap(), [4.0, 5.0]);
        match Checkpoint::open(fixtures().join("two_files_dir")) {
            Err(StError::AmbiguousDirectory { files, .. }) => {
                assert_eq!(files, ["a.safetensors", "b.safetensors"])
            }
            other => panic!("{other:?}"),
        }
        let empty = Scratch::new("empty");
        assert!(matches!(
            Checkpoint::open(&empty.0),
            Err(StError::NoCheckpoint { .. })
        ));
        assert!(matches!(
            Checkpoint::open(empty.path("missing")),
            Err(StError::NotFound { .. })
        ));
        std::fs::write(empty.path("tiny.safetensors"), b"abc").unwrap();
        assert!(matches!(
            Checkpoint::open(&empty.0),
            Err(StError::HeaderTooSmall { len: 3, .. })
        ));
    }

    #[test]
    fn unknown_and_sub_byte_dtypes_are_listed() {
        let ckpt = Checkpoint::open(fixtures().join("unknown_dtype.safetensors")).unwrap();
        let q = ckpt.tensor("q").unwrap();
        assert_eq!(q.dtype(), &Dtype::Other("Q4_K_X".into()));
        assert_eq!(q.dtype().as_str(), "Q4_K_X");
        assert_eq!(q.bytes(), [1, 2, 3]);
        assert!(
            matches!(q.to_bf16(), Err(StError::UnsupportedConversion { dtype, .. }) if dtype == "Q4_K_X")
        );
        assert_eq!(ckpt.tensor("f").unwrap().to_f32().unwrap(), [1.5, -0.5]);
        // F4 [2, 3] in 3 bytes, accepted by safetensors 0.8.0's own reader (see the script).
        assert_eq!(
            expected_file("f4.safetensors")["accepted_by_safetensors"],
            true
        );
        let f4 = Checkpoint::open(fixtures().join("f4.safetensors")).unwrap();
        assert_eq!(f4.tensor("w").unwrap().dtype(), &Dtype::F4);
        assert_eq!(f4.tensor("w").unwrap().info().byte_len(), 3);
    }

    /// A scratch copy of the sharded fixture whose index is rewritten by `edit`.
    fn sharded_with(
        tag: &str,
        edit: impl FnOnce(&mut serde_json::Map<String, Value>, &Scratch),
    ) -> (Scratch, Result<Checkpoint, StError>) {
        let s = Scratch::copy_of("sharded", tag);
        let path = s.path(SAFE_WEIGHTS_INDEX_NAME);
        let mut index: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        edit(index["weight_map"].as_object_mut().unwrap(), &s);
        std::fs::write(&path, index.to_string()).unwrap();
        let r = Checkpoint::open(&s.0);
        (s, r)
    }

    const FC1: &str = "vision_model.encoder.layers.0.mlp.fc1.weight";
    const SHARD1: &str = "model-00001-of-00003.safetensors";
    const SHARD2: &str = "model-00002-of-00003.safetensors";

    #[test]
    fn index_routing_errors() {
        let (_s, r) = sharded_with("missing", |m, _| {
            m.insert(FC1.into(), json!("model-00009-of-00009.safetensors"));
        });
        assert!(
            matches!(r, Err(StError::MissingShard { shard, .. }) if shard == "model-00009-of-00009.safetensors")
        );
        for bad in [
            "../x",
            "/etc/passwd",
            "sub/model.safetensors",
            "a\\b",
            "..",
            ".",
            "",
        ] {
            let (_s, r) = sharded_with("unsafe", |m, _| {
                m.insert(FC1.into(), json!(bad));
            });
            assert!(
                matches!(r, Err(StError::UnsafeFileName { ref name, .. }) if name == bad),
                "{bad}: {r:?}"
            );
        }
        let (_s, r) = sharded_with("wrong", |m, _| {
            m.insert(FC1.into(), json!(SHARD1));
        });
        match r {
            Err(StError::TensorNotInShard {
                tensor,
                expected,
                found,
            }) => {
                assert_eq!(
                    (tensor.as_str(), expected.as_str(), found.as_deref()),
                    (FC1, SHARD1, Some(SHARD2))
                );
            }
            other => panic!("{other:?}"),
        }
        let (_s, r) = sharded_with("unlisted", |m, _| {
            m.shift_remove(FC1);
        });
        assert!(
            matches!(r, Err(StError::TensorNotInIndex { tensor, shard }) if tensor == FC1 && shard == SHARD2)
        );
        let (_s, r) = sharded_with("phantom", |m, _| {
            m.insert("vision_model.ghost".into(), json!(SHARD2));
        });
        assert!(
            matches!(r, Err(StError::TensorNotInShard { tensor, found: None, .. }) if tensor == "vision_model.ghost")
        );
        // A copy of shard 1 routed as a fourth shard: its tensors now live in two shards.
        let (_s, r) = sharded_with("twice", |m, s| {
            std::fs::copy(s.path(SHARD1), s.path("model-extra.safetensors")).unwrap();
            m.insert(
                "vision_model.embeddings.position_embedding.weight".into(),
                json!("model-extra.safetensors"),
            );
        });
        assert!(
            matches!(r, Err(StError::TensorInTwoShards { tensor, first, second })
            if tensor == "vision_model.embeddings.patch_embedding.weight" && first == "model-00001-of-00003.safetensors" && second == "model-extra.safetensors")
        );
    }

    #[test]
    fn broken_index_and_config_files_are_named() {
        let s = Scratch::copy_of("sharded", "badindex");
        std::fs::write(s.path(SAFE_WEIGHTS_INDEX_NAME), b"{\"weight_map\": ").unwrap();
        assert!(
            matches!(Checkpoint::open(&s.0), Err(StError::InvalidJson { path, .. }) if path == s.path(SAFE_WEIGHTS_INDEX_NAME))
        );
        std::fs::write(s.path(SAFE_WEIGHTS_INDEX_NAME), b"{\"metadata\": {}}").unwrap();
        assert!(matches!(
            Checkpoint::open(&s.0),
            Err(StError::InvalidIndex { .. })
        ));
        std::fs::write(
            s.path(SAFE_WEIGHTS_INDEX_NAME),
            b"{\"weight_map\": {\"a\": 1}}",
        )
        .unwrap();
        assert!(
            matches!(Checkpoint::open(&s.0), Err(StError::InvalidIndex { reason, .. }) if reason.contains("`a`"))
        );

        let s = Scratch::copy_of("model_dir", "badconfig");
        std::fs::write(s.path("preprocessor_config.json"), b"{\"size\": 4,}").unwrap();
        assert!(
            matches!(Checkpoint::open(&s.0), Err(StError::InvalidJson { path, .. }) if path == s.path("preprocessor_config.json"))
        );
        // A broken tokenizer.json only fails when asked for.
        let s = Scratch::copy_of("model_dir", "badtok");
        std::fs::write(s.path("tokenizer.json"), b"nope").unwrap();
        let ckpt = Checkpoint::open(&s.0).unwrap();
        assert!(
            matches!(ckpt.tokenizer_json(), Err(StError::InvalidJson { path, .. }) if path == s.path("tokenizer.json"))
        );
    }

    #[test]
    fn corrupt_shard_is_named() {
        let s = Scratch::copy_of("sharded", "corrupt");
        let path = s.path(SHARD2);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.truncate(bytes.len() - 1);
        std::fs::write(&path, bytes).unwrap();
        assert!(
            matches!(Checkpoint::open(&s.0), Err(StError::OffsetOutOfBounds { file, .. }) if file == path)
        );
    }

    #[test]
    fn plain_file_names() {
        for ok in [
            "model.safetensors",
            "model-00001-of-00002.safetensors",
            "..x",
            "a..b",
        ] {
            assert!(is_plain_file_name(ok), "{ok}");
        }
        for bad in ["", ".", "..", "../x", "/abs", "a/b", "a\\b", "x\0y"] {
            assert!(!is_plain_file_name(bad), "{bad}");
        }
    }
}
