//! Reading an OCI image layout: choosing the manifest, and reading blobs by verified digest.
//!
//! A layout is a directory with `oci-layout`, `index.json` and `blobs/<alg>/<hex>`. The index
//! may name several manifests (tags, platforms) and may nest indexes. Every blob read is
//! checked against its descriptor's size and SHA-256 digest.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::error::{ImageError, Result};
use crate::stream::sha256_digest;

mod select;

pub(crate) use select::layer_compression;
pub(crate) use select::{pick, INDEX_TYPES, MANIFEST_TYPES};

/// How deep indexes may nest.
pub(crate) const MAX_INDEX_DEPTH: usize = 4;

/// A content descriptor (the fields Wharf uses).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    #[serde(default)]
    pub platform: Option<Platform>,
}

/// Where a manifest runs.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Platform {
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub architecture: String,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Index {
    #[serde(default)]
    pub manifests: Vec<Descriptor>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Manifest {
    pub config: Descriptor,
    #[serde(default)]
    pub layers: Vec<Descriptor>,
}

/// The fields of an image config that Wharf checks.
#[derive(Debug, Deserialize)]
pub(crate) struct Config {
    pub rootfs: RootFs,
}

#[derive(Debug, Deserialize)]
pub(crate) struct RootFs {
    #[serde(default)]
    pub diff_ids: Vec<String>,
}

/// The manifest chosen for import.
#[derive(Debug)]
pub(crate) struct Resolved {
    /// Digest of the manifest, which names the image.
    pub digest: String,
    /// Layers, bottom first.
    pub layers: Vec<Descriptor>,
    /// The digest of each layer's uncompressed tar stream, from the config, bottom first.
    pub diff_ids: Vec<String>,
}

/// Whether `dir` looks like an OCI image layout.
pub(crate) fn is_layout(dir: &Path) -> bool {
    dir.join("oci-layout").is_file() && dir.join("index.json").is_file()
}

/// The hex part of a well-formed `sha256:<64 lowercase hex>` digest; else why not.
pub(crate) fn sha256_hex(digest: &str) -> Result<&str, String> {
    let hex = digest
        .strip_prefix("sha256:")
        .ok_or_else(|| format!("{digest:?} is not sha256 (the only supported)"))?;
    if hex.len() != 64
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(format!("{digest:?} is malformed"));
    }
    Ok(hex)
}

/// An OCI image layout on disk.
#[derive(Debug)]
pub(crate) struct Layout {
    dir: PathBuf,
    max_json: u64,
}

impl Layout {
    /// Opens the layout at `dir`, reading at most `max_json` bytes of any JSON document.
    pub fn open(dir: &Path, max_json: u64) -> Result<Layout> {
        let layout = Layout {
            dir: dir.to_path_buf(),
            max_json,
        };
        let marker: serde_json::Value = layout.read_json_file("oci-layout")?;
        if marker
            .get("imageLayoutVersion")
            .and_then(|v| v.as_str())
            .is_none()
        {
            return Err(ImageError::invalid(format!(
                "{}/oci-layout has no imageLayoutVersion",
                dir.display()
            )));
        }
        Ok(layout)
    }

    /// Chooses the manifest tagged `tag` (else the only or first one), following nested
    /// indexes and picking this node's platform (linux/amd64 on x86-64) from multi-arch ones.
    /// Reads and verifies the manifest and its config.
    pub fn resolve(&self, tag: Option<&str>, max_layers: usize) -> Result<Resolved> {
        let index: Index = self.read_json_file("index.json")?;
        let mut candidates = index.manifests;
        let mut tag = tag;
        for _ in 0..MAX_INDEX_DEPTH {
            let chosen = pick(&candidates, tag)?.clone();
            tag = None;
            let media = chosen.media_type.as_str();
            if INDEX_TYPES.contains(&media) {
                let nested: Index = self.read_json_blob(&chosen)?;
                candidates = nested.manifests;
                continue;
            }
            // An empty media type (older writers) is read as a manifest.
            if !media.is_empty() && !MANIFEST_TYPES.contains(&media) {
                return Err(ImageError::invalid(format!(
                    "manifest {} has unsupported media type {media:?}",
                    chosen.digest
                )));
            }
            let manifest: Manifest = self.read_json_blob(&chosen)?;
            if manifest.layers.len() > max_layers {
                return Err(ImageError::invalid(format!(
                    "image has {} layers; the limit is {max_layers}",
                    manifest.layers.len()
                )));
            }
            // The config's diff_ids pin each layer's uncompressed content, which the
            // manifest's digests (of compressed blobs) alone do not.
            let config: Config = self.read_json_blob(&manifest.config)?;
            let diff_ids = config.rootfs.diff_ids;
            if diff_ids.len() != manifest.layers.len() {
                return Err(ImageError::invalid(format!(
                    "image config {} lists {} diff_ids for the manifest's {} layers; the image \
                     is corrupt",
                    manifest.config.digest,
                    diff_ids.len(),
                    manifest.layers.len()
                )));
            }
            for id in &diff_ids {
                sha256_hex(id).map_err(|e| {
                    ImageError::invalid(format!(
                        "image config {}: diff_id {e}",
                        manifest.config.digest
                    ))
                })?;
            }
            return Ok(Resolved {
                digest: chosen.digest,
                layers: manifest.layers,
                diff_ids,
            });
        }
        Err(ImageError::invalid(format!(
            "image indexes nest deeper than {MAX_INDEX_DEPTH}"
        )))
    }

    /// Path of the blob `digest`, after checking that it is a well-formed sha256 digest.
    fn blob_path(&self, digest: &str) -> Result<PathBuf> {
        let hex = sha256_hex(digest).map_err(|e| ImageError::invalid(format!("digest {e}")))?;
        Ok(self.dir.join("blobs/sha256").join(hex))
    }

    /// Opens the blob of `desc`, checking that its size is the descriptor's.
    pub fn open_blob(&self, desc: &Descriptor) -> Result<File> {
        let path = self.blob_path(&desc.digest)?;
        let file = File::open(&path).map_err(|e| {
            let what = format!(
                "blob {} of the OCI layout {}",
                desc.digest,
                self.dir.display()
            );
            ImageError::io(what, e)
        })?;
        let meta = file
            .metadata()
            .map_err(|e| ImageError::io(path.display(), e))?;
        if !meta.is_file() || meta.len() != desc.size {
            return Err(ImageError::invalid(format!(
                "blob {} is {} bytes; its descriptor says {}",
                desc.digest,
                meta.len(),
                desc.size
            )));
        }
        Ok(file)
    }

    fn read_json_blob<T: DeserializeOwned>(&self, desc: &Descriptor) -> Result<T> {
        if desc.size > self.max_json {
            return Err(ImageError::invalid(format!(
                "blob {} is {} bytes; JSON documents are limited to {}",
                desc.digest, desc.size, self.max_json
            )));
        }
        let mut bytes = Vec::new();
        self.open_blob(desc)?
            .take(desc.size + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| ImageError::io(format!("reading blob {}", desc.digest), e))?;
        let actual = sha256_digest(&bytes);
        if actual != desc.digest || bytes.len() as u64 != desc.size {
            return Err(ImageError::invalid(format!(
                "blob {} does not match its digest (content hashes to {actual})",
                desc.digest
            )));
        }
        serde_json::from_slice(&bytes)
            .map_err(|e| ImageError::invalid(format!("blob {} is not valid: {e}", desc.digest)))
    }

    fn read_json_file<T: DeserializeOwned>(&self, name: &str) -> Result<T> {
        let path = self.dir.join(name);
        let file = File::open(&path).map_err(|e| ImageError::io(path.display(), e))?;
        let mut bytes = Vec::new();
        file.take(self.max_json + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| ImageError::io(path.display(), e))?;
        if bytes.len() as u64 > self.max_json {
            return Err(ImageError::invalid(format!(
                "{} is larger than {} bytes",
                path.display(),
                self.max_json
            )));
        }
        serde_json::from_slice(&bytes)
            .map_err(|e| ImageError::invalid(format!("{} is not valid: {e}", path.display())))
    }
}
