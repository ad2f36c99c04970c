//! Opening a weight file of either format.

use crate::Error;
use gguf_reader::GgufFile;
use st_reader::Checkpoint;
use std::io::Read;
use std::path::Path;

/// GGUF files begin with these four bytes (ggml/docs/gguf.md).
const GGUF_MAGIC: &[u8; 4] = b"GGUF";

/// An opened weight file: a GGUF (llama.cpp mmproj) or a safetensors checkpoint.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // one long-lived handle per model; boxing buys nothing
pub enum WeightFile {
    /// A GGUF file.
    Gguf(GgufFile),
    /// A safetensors file, model directory or sharded directory.
    SafeTensors(Checkpoint),
}

impl WeightFile {
    /// Opens `path`: a directory is a safetensors checkpoint; a file is GGUF when it starts with
    /// the GGUF magic and safetensors otherwise.
    ///
    /// The files are memory-mapped: they must not change or shrink while the returned value
    /// lives (the OS may deliver SIGBUS otherwise).
    pub fn open(path: &Path) -> Result<WeightFile, Error> {
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(io)?;
        if meta.is_dir() {
            let result = open_safetensors(path);
            if result.is_err() {
                if let Some(files) = gguf_files_in(path) {
                    return Err(Error::GgufDirectory {
                        path: path.to_path_buf(),
                        files,
                    });
                }
            }
            return result;
        }
        let mut magic = [0u8; 8];
        let mut file = std::fs::File::open(path).map_err(io)?;
        let n = read_up_to(&mut file, &mut magic).map_err(io)?;
        if n >= 4 && &magic[..4] == GGUF_MAGIC {
            return GgufFile::open(path)
                .map(WeightFile::Gguf)
                .map_err(|source| Error::Gguf {
                    path: path.to_path_buf(),
                    source: Box::new(source),
                });
        }
        if n < 8 {
            return Err(Error::UnknownFormat {
                path: path.to_path_buf(),
                magic: hex(&magic[..n]),
            });
        }
        open_safetensors(path)
    }

    /// `"gguf"` or `"safetensors"`.
    pub fn format(&self) -> &'static str {
        match self {
            WeightFile::Gguf(_) => "gguf",
            WeightFile::SafeTensors(_) => "safetensors",
        }
    }
}

fn open_safetensors(path: &Path) -> Result<WeightFile, Error> {
    Checkpoint::open(path)
        .map(WeightFile::SafeTensors)
        .map_err(|source| Error::SafeTensors {
            path: path.to_path_buf(),
            source: Box::new(source),
        })
}

/// The `.gguf` files directly in `dir`, comma-separated, or `None` when there are none.
fn gguf_files_in(dir: &Path) -> Option<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".gguf"))
        .collect();
    names.sort();
    (!names.is_empty()).then(|| names.join(", "))
}

fn read_up_to(file: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..])? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}

fn hex(bytes: &[u8]) -> String {
    if bytes.is_empty() {
        return "(empty file)".to_string();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
