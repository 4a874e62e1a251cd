//! The three kinds of import source, each unpacked through the same extractor.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use crate::dirsource::with_tar_stream;
use crate::error::{ImageError, Result};
use crate::extract::{apply_stream, Whiteouts};
use crate::limits::Budget;
use crate::oci::{layer_compression, Descriptor, Layout};
use crate::rootfs::RootDir;
use crate::stream::{decompress, sniff, CapReader, Compression, HashingReader};

const READ_BUF: usize = 256 << 10;

/// Where an image comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Source {
    /// A rootfs tarball, plain, gzip or zstd.
    Tarball(PathBuf),
    /// A directory holding a root filesystem.
    Directory(PathBuf),
    /// An OCI image layout, with the tag to pick.
    OciLayout { dir: PathBuf, tag: Option<String> },
}

impl Source {
    /// Tells what `source` is: an OCI layout (`DIR` or `DIR:TAG`), another directory, or a
    /// file taken as a tarball.
    pub fn classify(source: &Path) -> Result<Source> {
        match std::fs::metadata(source) {
            Ok(m) if m.is_dir() && crate::oci::is_layout(source) => Ok(Source::OciLayout {
                dir: source.to_path_buf(),
                tag: None,
            }),
            Ok(m) if m.is_dir() => Ok(Source::Directory(source.to_path_buf())),
            Ok(m) if m.is_file() => Ok(Source::Tarball(source.to_path_buf())),
            Ok(_) => Err(ImageError::invalid(format!(
                "{} is neither a file nor a directory",
                source.display()
            ))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => match split_tag(source) {
                Some((dir, tag)) if crate::oci::is_layout(&dir) => Ok(Source::OciLayout {
                    dir,
                    tag: Some(tag),
                }),
                _ => Err(ImageError::not_found(format!(
                    "{} does not exist; give a tarball (.tar, .tar.gz, .tar.zst), a directory \
                     holding a root filesystem, or an OCI layout as DIR or DIR:TAG",
                    source.display()
                ))),
            },
            Err(e) => Err(ImageError::io(source.display(), e)),
        }
    }

    /// The kind, as recorded in [`crate::ImageInfo::source`].
    pub fn kind(&self) -> &'static str {
        match self {
            Source::Tarball(_) => "tarball",
            Source::Directory(_) => "directory",
            Source::OciLayout { .. } => "oci-layout",
        }
    }

    /// Unpacks into `root`; returns the image digest: SHA-256 of the uncompressed tar stream
    /// for a tarball or directory, the manifest digest for an OCI layout.
    pub fn unpack(&self, root: &RootDir, budget: &mut Budget) -> Result<String> {
        match self {
            Source::Tarball(path) => {
                let file = File::open(path).map_err(|e| ImageError::io(path.display(), e))?;
                let (kind, raw) = sniff(BufReader::with_capacity(READ_BUF, file))?;
                unpack_tar(root, decompress(kind, raw)?, budget)
            }
            Source::Directory(dir) => {
                with_tar_stream(dir, |stream| unpack_tar(root, stream, budget))
            }
            Source::OciLayout { dir, tag } => unpack_layout(root, dir, tag.as_deref(), budget),
        }
    }
}

/// `DIR:TAG` split at the last colon, if the tag part could be a tag.
fn split_tag(source: &Path) -> Option<(PathBuf, String)> {
    let (dir, tag) = source.to_str()?.rsplit_once(':')?;
    if dir.is_empty() || tag.is_empty() || tag.contains('/') {
        return None;
    }
    Some((PathBuf::from(dir), tag.to_string()))
}

/// Unpacks one uncompressed tar stream with whiteouts taken literally; returns its digest.
fn unpack_tar(root: &RootDir, stream: impl Read, budget: &mut Budget) -> Result<String> {
    let capped = CapReader::new(
        stream,
        budget.stream_allowance(),
        "the uncompressed tarball",
    );
    let mut hashed = HashingReader::new(capped);
    apply_stream(root, &mut hashed, Whiteouts::Literal, budget)?;
    hashed
        .drain()
        .map_err(|e| ImageError::stream("reading the end of the tarball", e))?;
    budget.spend_stream(hashed.len());
    Ok(hashed.digest())
}

/// Unpacks the chosen manifest's layers, bottom first; returns the manifest digest.
fn unpack_layout(
    root: &RootDir,
    dir: &Path,
    tag: Option<&str>,
    budget: &mut Budget,
) -> Result<String> {
    let layout = Layout::open(dir, budget.limits().max_json_bytes)?;
    let resolved = layout.resolve(tag, budget.limits().max_layers)?;
    for (i, desc) in resolved.layers.iter().enumerate() {
        unpack_layer(root, &layout, desc, budget).map_err(|e| {
            ImageError::new(
                e.kind,
                format!("layer {} ({}): {}", i + 1, desc.digest, e.message),
            )
        })?;
    }
    Ok(resolved.digest)
}

fn unpack_layer(
    root: &RootDir,
    layout: &Layout,
    desc: &Descriptor,
    budget: &mut Budget,
) -> Result<()> {
    let compression = layer_compression(&desc.media_type)?;
    let file = layout.open_blob(desc)?;
    let mut raw = HashingReader::new(BufReader::with_capacity(READ_BUF, file).take(desc.size));
    let unpacked = apply_layer(root, compression, &mut raw, budget);
    // Read the rest either way: when unpacking failed, a digest mismatch is the better reason.
    let drained = raw.drain();
    let complete = raw.len() == desc.size;
    let digest = raw.digest();
    if drained.is_ok() && (!complete || digest != desc.digest) {
        return Err(ImageError::invalid(format!(
            "blob does not match its digest (content hashes to {digest}); the layout is corrupt \
             or was tampered with"
        )));
    }
    unpacked?;
    drained.map_err(|e| ImageError::io("reading the layer blob", e))?;
    Ok(())
}

fn apply_layer(
    root: &RootDir,
    compression: Compression,
    raw: impl Read,
    budget: &mut Budget,
) -> Result<()> {
    let stream = decompress(compression, raw)?;
    let mut capped = CapReader::new(stream, budget.stream_allowance(), "the uncompressed layers");
    let res = apply_stream(root, &mut capped, Whiteouts::Apply, budget);
    budget.spend_stream(capped.count());
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_tags() {
        assert_eq!(
            split_tag(Path::new("/x/img:v1")),
            Some(("/x/img".into(), "v1".into()))
        );
        assert_eq!(split_tag(Path::new("/x/img")), None);
        assert_eq!(split_tag(Path::new("/x:y/img")), None);
        assert_eq!(split_tag(Path::new("img:")), None);
    }
}
