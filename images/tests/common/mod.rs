//! Builders for test tarballs and OCI layouts, made with the `tar` crate (no network).
#![allow(dead_code)]

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use tar::{EntryType, Header};
use wharf_images::{ImageStore, Limits};

pub mod served;

/// A tar archive built entry by entry, with raw names so hostile paths can be written
/// (`Header::set_path` refuses `..` and absolute paths).
pub struct Tar {
    builder: tar::Builder<Vec<u8>>,
}

impl Default for Tar {
    fn default() -> Self {
        Tar {
            builder: tar::Builder::new(Vec::new()),
        }
    }
}

impl Tar {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends an entry with raw `name` and `link` bytes.
    pub fn raw(
        &mut self,
        kind: EntryType,
        name: &[u8],
        link: &[u8],
        data: &[u8],
        mode: u32,
    ) -> &mut Self {
        let mut h = Header::new_gnu();
        {
            let gnu = h.as_gnu_mut().unwrap();
            gnu.name[..name.len()].copy_from_slice(name);
            gnu.linkname[..link.len()].copy_from_slice(link);
        }
        h.set_entry_type(kind);
        h.set_size(data.len() as u64);
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        h.set_cksum();
        self.builder.append(&h, data).unwrap();
        self
    }

    pub fn dir(&mut self, name: &str) -> &mut Self {
        self.raw(EntryType::Directory, name.as_bytes(), b"", b"", 0o755)
    }

    pub fn file(&mut self, name: &str, data: &[u8]) -> &mut Self {
        self.raw(EntryType::Regular, name.as_bytes(), b"", data, 0o644)
    }

    pub fn file_owned(
        &mut self,
        name: &str,
        data: &[u8],
        mode: u32,
        uid: u64,
        gid: u64,
    ) -> &mut Self {
        let mut h = Header::new_gnu();
        h.as_gnu_mut().unwrap().name[..name.len()].copy_from_slice(name.as_bytes());
        h.set_entry_type(EntryType::Regular);
        h.set_size(data.len() as u64);
        h.set_mode(mode);
        h.set_uid(uid);
        h.set_gid(gid);
        h.set_cksum();
        self.builder.append(&h, data).unwrap();
        self
    }

    pub fn symlink(&mut self, name: &str, target: &str) -> &mut Self {
        self.raw(
            EntryType::Symlink,
            name.as_bytes(),
            target.as_bytes(),
            b"",
            0o777,
        )
    }

    pub fn hardlink(&mut self, name: &str, target: &str) -> &mut Self {
        self.raw(
            EntryType::Link,
            name.as_bytes(),
            target.as_bytes(),
            b"",
            0o644,
        )
    }

    pub fn bytes(&mut self) -> Vec<u8> {
        let b = std::mem::replace(&mut self.builder, tar::Builder::new(Vec::new()));
        b.into_inner().unwrap()
    }
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

pub fn zstd(data: &[u8]) -> Vec<u8> {
    zstd::encode_all(data, 3).unwrap()
}

pub fn sha256(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

/// A scratch area: `store` for the image store, `work` for sources, `outside` as the target
/// of escape attempts.
pub struct Scratch {
    pub _tmp: tempfile::TempDir,
    pub base: PathBuf,
    pub work: PathBuf,
    pub outside: PathBuf,
    pub store: ImageStore,
}

pub fn scratch() -> Scratch {
    scratch_with(Limits::default())
}

pub fn scratch_with(limits: Limits) -> Scratch {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().to_path_buf();
    let work = base.join("work");
    let outside = base.join("outside");
    fs::create_dir_all(&work).unwrap();
    fs::create_dir_all(&outside).unwrap();
    let store = ImageStore::open(base.join("store"))
        .unwrap()
        .with_limits(limits);
    Scratch {
        _tmp: tmp,
        base,
        work,
        outside,
        store,
    }
}

impl Scratch {
    /// Writes `data` to `work/name` and returns the path.
    pub fn put(&self, name: &str, data: &[u8]) -> PathBuf {
        let p = self.work.join(name);
        fs::write(&p, data).unwrap();
        p
    }

    /// The store has nothing in progress or left over.
    pub fn assert_no_leftovers(&self) {
        let tmp = self.store.root().join("tmp");
        let left: Vec<_> = fs::read_dir(&tmp).unwrap().collect();
        assert!(left.is_empty(), "leftovers in {}: {left:?}", tmp.display());
    }

    /// `outside` is still empty.
    pub fn assert_outside_untouched(&self) {
        let left: Vec<_> = fs::read_dir(&self.outside).unwrap().collect();
        assert!(left.is_empty(), "something was written outside: {left:?}");
    }
}

/// Every path under `dir` whose file name is `name` (symlinks not followed).
pub fn find_named(dir: &Path, name: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            if e.file_name() == name {
                found.push(e.path());
            }
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            }
        }
    }
    found
}

/// An OCI image layout being written.
pub struct Layout {
    pub dir: PathBuf,
}

pub const LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
pub const LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const LAYER_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
pub const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const INDEX: &str = "application/vnd.oci.image.index.v1+json";

impl Layout {
    pub fn new(dir: PathBuf) -> Self {
        fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
        fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
        Layout { dir }
    }

    /// Stores a blob; returns a descriptor for it.
    pub fn blob(&self, media_type: &str, data: &[u8]) -> serde_json::Value {
        let digest = sha256(data);
        fs::write(self.blob_path(&digest), data).unwrap();
        serde_json::json!({ "mediaType": media_type, "digest": digest, "size": data.len() })
    }

    pub fn blob_path(&self, digest: &str) -> PathBuf {
        self.dir
            .join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:"))
    }

    /// Stores a config and a manifest over `layers` (media type, blob); returns the
    /// manifest's descriptor. The config's diff_ids are the layers' true ones.
    pub fn manifest(&self, layers: &[(&str, Vec<u8>)]) -> serde_json::Value {
        let diff_ids: Vec<String> = layers.iter().map(|(m, b)| diff_id(m, b)).collect();
        self.manifest_with_diff_ids(layers, &diff_ids)
    }

    /// [`Layout::manifest`] with the config's diff_ids given.
    pub fn manifest_with_diff_ids(
        &self,
        layers: &[(&str, Vec<u8>)],
        diff_ids: &[String],
    ) -> serde_json::Value {
        let config = served::config_json(diff_ids, serde_json::json!({}));
        let config = self.blob(served::CONFIG, &config);
        let layers: Vec<_> = layers.iter().map(|(m, b)| self.blob(m, b)).collect();
        self.blob(MANIFEST, &served::manifest_json(config, layers))
    }

    /// Stores a nested index over `manifests`; returns its descriptor.
    pub fn nested_index(&self, manifests: Vec<serde_json::Value>) -> serde_json::Value {
        let index =
            serde_json::json!({ "schemaVersion": 2, "mediaType": INDEX, "manifests": manifests });
        self.blob(INDEX, &serde_json::to_vec(&index).unwrap())
    }

    /// Writes `index.json` over `manifests`.
    pub fn index(&self, manifests: Vec<serde_json::Value>) {
        let index =
            serde_json::json!({ "schemaVersion": 2, "mediaType": INDEX, "manifests": manifests });
        fs::write(
            self.dir.join("index.json"),
            serde_json::to_vec(&index).unwrap(),
        )
        .unwrap();
    }
}

/// The digest of a layer's uncompressed content (its blob, for a media type not handled).
pub fn diff_id(media_type: &str, blob: &[u8]) -> String {
    let plain = if media_type.ends_with("gzip") {
        let mut out = Vec::new();
        let mut d = flate2::read::MultiGzDecoder::new(blob);
        std::io::Read::read_to_end(&mut d, &mut out)
            .map(|_| out)
            .ok()
    } else if media_type.ends_with("zstd") {
        zstd::decode_all(blob).ok()
    } else {
        None
    };
    sha256(plain.as_deref().unwrap_or(blob))
}

/// `desc` with a tag annotation.
pub fn tagged(mut desc: serde_json::Value, tag: &str) -> serde_json::Value {
    desc["annotations"] = serde_json::json!({ "org.opencontainers.image.ref.name": tag });
    desc
}

/// `desc` with a platform.
pub fn for_platform(mut desc: serde_json::Value, os: &str, arch: &str) -> serde_json::Value {
    desc["platform"] = serde_json::json!({ "os": os, "architecture": arch });
    desc
}
