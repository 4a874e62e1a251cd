//! Pulling a registry image into the store: resolve the manifest (an index to this node's
//! platform), check the config, unpack each missing layer from its download, stack the root
//! once per manifest digest, and name it by the reference's canonical form.

use std::path::PathBuf;

use wharf_api::image_ref::ImageRef;

use crate::cache::{CacheLock, Pin};
use crate::error::{ImageError, Result};
use crate::layers::{ensure_layer, ensure_root, layer_dir, Lock, RootParts};
use crate::limits::Budget;
use crate::oci::{
    layer_compression, pick, sha256_hex, Config, Descriptor, Index, Manifest, INDEX_TYPES,
    MANIFEST_TYPES, MAX_INDEX_DEPTH,
};
use crate::registry::{Registry, RegistryOptions};
use crate::store::{ImageInfo, ImageStore};
use crate::stream::sha256_digest;
use sha2::Digest as _;

/// What a pull is doing, for progress lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PullEvent {
    /// The manifest is chosen: its digest, its layer count and their compressed size.
    Resolved {
        /// Manifest digest.
        digest: String,
        /// Layers.
        layers: usize,
        /// Bytes to download at most.
        bytes: u64,
    },
    /// Layer `index` (from 1) is in the store: `fetched` when this pull downloaded it.
    Layer {
        /// From 1, bottom first.
        index: usize,
        /// Blob digest.
        digest: String,
        /// Compressed size.
        size: u64,
        /// Downloaded now (else it was there already, or another pull made it).
        fetched: bool,
    },
    /// Bytes this pull has downloaded so far, over all its layers (resumed downloads count
    /// what arrived); sent while layers download, at most every [`BYTES_EVERY`], and once
    /// more when the last of them ends.
    Bytes {
        /// Downloaded so far.
        fetched: u64,
    },
    /// The root is ready.
    Done(ImageInfo),
}

/// How often [`PullEvent::Bytes`] is sent while layers download.
pub const BYTES_EVERY: std::time::Duration = std::time::Duration::from_millis(200);

/// A download that counts what is read from it into a total shared by a pull's layers.
struct Counted {
    inner: Box<dyn std::io::Read + Send + Sync>,
    total: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl std::io::Read for Counted {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.total
            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(n)
    }
}

impl ImageStore {
    /// The image pulled earlier for `reference`, if any (a tag is not asked again: the node
    /// keeps what it pulled until the image is removed, so every job on it sees the same).
    pub fn pulled(&self, reference: &ImageRef) -> Option<ImageInfo> {
        self.get(&reference.to_string()).ok()
    }

    /// Pulls `reference` into the store, under its canonical name, reporting to `progress`.
    /// Layers already in the store are not fetched; layers and roots being made by another
    /// pull are waited for, not fetched twice.
    ///
    /// Errors: the registry's (`NotFound`, `Refused`, `Unreachable`, with its reason); `InvalidInput` for a malformed or tampered image or one over the [`Limits`]
    /// (`crate::Limits`). Nothing of a failed layer is kept.
    ///
    /// With a quota ([`ImageStore::with_quota`]), evicts least recently used images not in use
    /// once done (see [`ImageStore::evict`]), never this one.
    pub fn pull(
        &self,
        reference: &ImageRef,
        opts: &RegistryOptions,
        progress: &mut dyn FnMut(PullEvent),
    ) -> Result<ImageInfo> {
        self.pull_pinned(reference, opts, progress)
            .map(|(info, _pin)| info)
    }

    /// [`ImageStore::pull`], returning the image pinned: it cannot be evicted or removed
    /// until the [`Pin`] is dropped (the agent holds it until the job's shim holds its own).
    pub fn pull_pinned(
        &self,
        reference: &ImageRef,
        opts: &RegistryOptions,
        progress: &mut dyn FnMut(PullEvent),
    ) -> Result<(ImageInfo, Pin)> {
        let name = reference.to_string();
        crate::name::validate_name(&name)?;
        // No eviction while this pull needs layers it has not stacked yet.
        let cache = CacheLock::shared(self.root())?;
        let (info, pin) = self.pull_once(reference, opts, progress)?;
        drop(cache);
        self.enforce_quota();
        progress(PullEvent::Done(info.clone()));
        Ok((info, pin))
    }

    /// [`ImageStore::pull_pinned`] under the reference's own lock: pulls of one reference, in
    /// this process or another, run one at a time, and one that waited for another is served
    /// what that one published instead of asking the registry again. Without this, each of
    /// twenty jobs starting at once would fetch the manifest and the config blob itself
    /// (layers were already shared through their own locks).
    fn pull_once(
        &self,
        reference: &ImageRef,
        opts: &RegistryOptions,
        progress: &mut dyn FnMut(PullEvent),
    ) -> Result<(ImageInfo, Pin)> {
        let name = reference.to_string();
        let before = self.pulled(reference);
        let _one = Lock::take(
            self.root(),
            &format!(
                "pull-{}",
                hex::encode(sha2::Sha256::digest(name.as_bytes()))
            ),
        )?;
        if let Some(info) = self
            .pulled(reference)
            .filter(|now| Some(now) != before.as_ref())
        {
            // Published by the pull this one waited for. A private image is served only to
            // credentials that reach it, as from the cache: the other pull's may not be ours.
            if info.private {
                check_access(reference, &info.digest, opts)?;
            }
            let pin = Pin::rootfs(&info.rootfs)?;
            return Ok((info, pin));
        }
        // Mirrors first, in order; whatever one fails with (down, missing the image, refusing
        // us, or serving content that fails its digests), the next is tried, the registry
        // itself last. Layers a failed attempt verified are kept for the next.
        let mut failed = Vec::new();
        for source in opts.sources(reference)? {
            let registry = Registry::at(reference, &source, opts);
            match self.pull_from(&registry, reference, progress) {
                Ok(info) => {
                    let pin = Pin::rootfs(&info.rootfs)?;
                    return Ok((info, pin));
                }
                Err(e) if source.mirror => {
                    tracing::warn!(image = %reference, mirror = %source.host, error = %e, "mirror failed; trying the next source");
                    failed.push(format!("mirror {}: {}", source.host, e.message));
                }
                Err(e) if failed.is_empty() => return Err(e),
                Err(e) => {
                    return Err(ImageError::new(
                        e.kind,
                        format!("{} (after: {})", e.message, failed.join("; ")),
                    ))
                }
            }
        }
        Err(ImageError::invalid(format!(
            "{reference}: nowhere to pull it from"
        )))
    }

    /// One attempt of [`ImageStore::pull_pinned`], from one source.
    fn pull_from(
        &self,
        registry: &Registry,
        reference: &ImageRef,
        progress: &mut dyn FnMut(PullEvent),
    ) -> Result<ImageInfo> {
        let name = reference.to_string();
        let limits = *self.limits();
        let (digest, manifest) = resolve(registry, reference, limits.max_json_bytes)?;
        if manifest.layers.len() > limits.max_layers {
            return Err(ImageError::invalid(format!(
                "{name}: the image has {} layers; the limit is {}",
                manifest.layers.len(),
                limits.max_layers
            )));
        }
        for layer in &manifest.layers {
            layer_compression(&layer.media_type)?;
            sha256_hex(&layer.digest).map_err(|e| ImageError::invalid(format!("layer {e}")))?;
        }
        let config_bytes = read_json_blob(registry, &manifest.config, limits.max_json_bytes)?;
        let config: Config = serde_json::from_slice(&config_bytes).map_err(|e| {
            ImageError::invalid(format!("blob {} is not valid: {e}", manifest.config.digest))
        })?;
        let diff_ids = config.rootfs.diff_ids;
        if diff_ids.len() != manifest.layers.len() {
            return Err(ImageError::invalid(format!(
                "{name}: the image config lists {} diff_ids for the manifest's {} layers; the \
                 image is corrupt",
                diff_ids.len(),
                manifest.layers.len()
            )));
        }
        progress(PullEvent::Resolved {
            digest: digest.clone(),
            layers: manifest.layers.len(),
            bytes: manifest.layers.iter().map(|l| l.size).sum(),
        });
        for id in &diff_ids {
            sha256_hex(id).map_err(|e| ImageError::invalid(format!("diff_id {e}")))?;
        }
        self.fetch_layers(registry, &name, &manifest.layers, &diff_ids, progress)?;
        let dirs = manifest
            .layers
            .iter()
            .map(|l| layer_dir(self.root(), &l.digest))
            .collect::<Result<Vec<PathBuf>>>()?;
        let digests: Vec<String> = manifest.layers.iter().map(|l| l.digest.clone()).collect();
        let parts = RootParts {
            digests: &digests,
            dirs: &dirs,
            config: &config_bytes,
        };
        let rootfs = ensure_root(self.root(), &digest, &parts)?;
        self.publish_pulled(&name, digest, rootfs, digests, registry.authenticated())
    }
}

/// Checks that `opts` (the job's user's credential, else the site's, else none) give access to
/// manifest `digest` of `reference`'s repository, at a mirror of its registry or at the
/// registry itself, in the order a pull tries them: a `HEAD` of the manifest by digest. This
/// is what a cached image that needed credentials to pull ([`ImageInfo::private`]) is served
/// against.
///
/// Errors: every source's refusal, the last one's kind (`Refused` when the registry refused
/// the credentials or wanted some, `NotFound` when it has no such manifest, `Unreachable`
/// when it cannot be reached).
pub fn check_access(reference: &ImageRef, digest: &str, opts: &RegistryOptions) -> Result<()> {
    let mut failed: Vec<ImageError> = Vec::new();
    for source in opts.sources(reference)? {
        match Registry::at(reference, &source, opts).has_manifest(digest) {
            Ok(()) => return Ok(()),
            Err(e) => failed.push(e),
        }
    }
    let kind = failed.last().map_or(crate::ErrorKind::Refused, |e| e.kind);
    let why: Vec<String> = failed.into_iter().map(|e| e.message).collect();
    Err(ImageError::new(kind, why.join("; ")))
}

/// Most layers downloaded and unpacked at once by one pull.
const PARALLEL_LAYERS: usize = 4;

impl ImageStore {
    /// Makes sure every layer is in the store, up to [`PARALLEL_LAYERS`] at a time, each
    /// streamed from its download into the extractor. Each layer is counted against what the
    /// layers finished before it left of the image's [`crate::Limits`], and their sum is
    /// checked as each ends, so an image over its limits is refused (the layers that were
    /// complete and verified are kept for other images). Reports each layer as it ends; on
    /// an error, starts no more, waits for those running, and returns the first error.
    fn fetch_layers(
        &self,
        registry: &Registry,
        name: &str,
        layers: &[Descriptor],
        diff_ids: &[String],
        progress: &mut dyn FnMut(PullEvent),
    ) -> Result<()> {
        let spent = std::sync::Mutex::new(Budget::new(*self.limits()));
        let next = std::sync::atomic::AtomicUsize::new(0);
        let failed = std::sync::atomic::AtomicBool::new(false);
        let (tx, rx) = std::sync::mpsc::channel::<(usize, Result<bool>)>();
        let downloaded = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let workers = PARALLEL_LAYERS.min(layers.len());
        let mut first_error = None;
        std::thread::scope(|scope| {
            for _ in 0..workers {
                let tx = tx.clone();
                let (spent, next, failed) = (&spent, &next, &failed);
                let downloaded = &downloaded;
                scope.spawn(move || loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if i >= layers.len() || failed.load(std::sync::atomic::Ordering::SeqCst) {
                        return;
                    }
                    let desc = &layers[i];
                    let before = match spent.lock() {
                        Ok(b) => b.clone(),
                        Err(_) => return,
                    };
                    let mut budget = before.clone();
                    let res = ensure_layer(
                        self.root(),
                        self.shared.as_ref(),
                        desc,
                        &diff_ids[i],
                        &mut budget,
                        || {
                            let counted: Box<dyn std::io::Read + Send + Sync> = Box::new(Counted {
                                inner: registry.blob(&desc.digest)?,
                                total: downloaded.clone(),
                            });
                            Ok(counted)
                        },
                    )
                    .and_then(|fetched| {
                        let mut total = spent.lock().map_err(|_| {
                            ImageError::new(crate::ErrorKind::Unavailable, "a pull thread panicked")
                        })?;
                        total.absorb(&before, &budget)?;
                        Ok(fetched)
                    });
                    if res.is_err() {
                        failed.store(true, std::sync::atomic::Ordering::SeqCst);
                    }
                    if tx.send((i, res)).is_err() {
                        return;
                    }
                });
            }
            drop(tx);
            let mut told = 0;
            let mut tell_bytes = |progress: &mut dyn FnMut(PullEvent)| {
                let now = downloaded.load(std::sync::atomic::Ordering::Relaxed);
                if now != told {
                    told = now;
                    progress(PullEvent::Bytes { fetched: now });
                }
            };
            loop {
                let (i, res) = match rx.recv_timeout(BYTES_EVERY) {
                    Ok(ended) => ended,
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                        tell_bytes(progress);
                        continue;
                    }
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                };
                tell_bytes(progress);
                let desc = &layers[i];
                match res {
                    Ok(fetched) => progress(PullEvent::Layer {
                        index: i + 1,
                        digest: desc.digest.clone(),
                        size: desc.size,
                        fetched,
                    }),
                    Err(e) if first_error.is_none() => {
                        first_error = Some(ImageError::new(
                            e.kind,
                            format!("{name}: layer {} ({}): {}", i + 1, desc.digest, e.message),
                        ));
                    }
                    Err(_) => {}
                }
            }
        });
        first_error.map_or(Ok(()), Err)
    }
}

/// Fetches `reference`'s manifest, following indexes to this node's platform; returns the
/// manifest's digest and the manifest.
fn resolve(registry: &Registry, reference: &ImageRef, max: u64) -> Result<(String, Manifest)> {
    let mut fetched = registry.manifest(reference.reference(), max)?;
    for _ in 0..MAX_INDEX_DEPTH {
        let media = media_type(&fetched)?;
        if INDEX_TYPES.contains(&media.as_str()) {
            let index: Index = parse(&fetched)?;
            let chosen = pick(&index.manifests, None)
                .map_err(|e| ImageError::new(e.kind, format!("{reference}: {}", e.message)))?;
            let next = registry.manifest(&chosen.digest, max)?;
            if next.digest != chosen.digest {
                return Err(ImageError::invalid(format!(
                    "{reference}: manifest {} hashes to {}; refused",
                    chosen.digest, next.digest
                )));
            }
            fetched = next;
            continue;
        }
        if !MANIFEST_TYPES.contains(&media.as_str()) {
            return Err(ImageError::invalid(format!(
                "{reference}: the registry served a {media:?}, not an image manifest or index \
                 (Docker schema 1 images are not supported)"
            )));
        }
        return Ok((fetched.digest.clone(), parse(&fetched)?));
    }
    Err(ImageError::invalid(format!(
        "{reference}: image indexes nest deeper than {MAX_INDEX_DEPTH}"
    )))
}

/// The document's media type: its own `mediaType` field, else the `Content-Type` it came with.
fn media_type(fetched: &crate::registry::Fetched) -> Result<String> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Head {
        media_type: Option<String>,
    }
    let head: Head = parse(fetched)?;
    Ok(head
        .media_type
        .unwrap_or_else(|| fetched.media_type.clone()))
}

fn parse<T: serde::de::DeserializeOwned>(fetched: &crate::registry::Fetched) -> Result<T> {
    serde_json::from_slice(&fetched.bytes)
        .map_err(|e| ImageError::invalid(format!("manifest {} is not valid: {e}", fetched.digest)))
}

/// Reads a small JSON blob (the config), checking its size and digest.
fn read_json_blob(registry: &Registry, desc: &Descriptor, max: u64) -> Result<Vec<u8>> {
    if desc.size > max {
        return Err(ImageError::invalid(format!(
            "blob {} is {} bytes; JSON documents are limited to {max}",
            desc.digest, desc.size
        )));
    }
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(
        &mut std::io::Read::take(registry.blob(&desc.digest)?, desc.size + 1),
        &mut bytes,
    )
    .map_err(|e| {
        ImageError::new(
            crate::ErrorKind::Unreachable,
            format!("reading blob {}: {e}", desc.digest),
        )
    })?;
    let actual = sha256_digest(&bytes);
    if actual != desc.digest || bytes.len() as u64 != desc.size {
        return Err(ImageError::invalid(format!(
            "blob {} does not match its digest (content hashes to {actual}); refused",
            desc.digest
        )));
    }
    Ok(bytes)
}
