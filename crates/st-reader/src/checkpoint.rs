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
mod tests;
