//! Choosing among an index's manifests, and telling layer compression from media types.

use super::Descriptor;
use crate::error::{ImageError, Result};
use crate::stream::Compression;

/// Annotation holding a manifest's tag in an index.
const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// Media types of an index (a list of manifests).
pub(crate) const INDEX_TYPES: [&str; 2] = [
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];
/// Media types of an image manifest.
pub(crate) const MANIFEST_TYPES: [&str; 2] = [
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
];

/// The platform this node runs, in OCI's spelling.
const HOST_ARCH: &str = if cfg!(target_arch = "x86_64") {
    "amd64"
} else if cfg!(target_arch = "aarch64") {
    "arm64"
} else {
    std::env::consts::ARCH
};

/// How a layer of media type `media_type` is compressed.
pub(crate) fn layer_compression(media_type: &str) -> Result<Compression> {
    let base = media_type
        .strip_prefix("application/vnd.oci.image.layer.v1.")
        .or_else(|| media_type.strip_prefix("application/vnd.oci.image.layer.nondistributable.v1."))
        .or_else(|| media_type.strip_prefix("application/vnd.docker.image.rootfs.diff."))
        .or_else(|| media_type.strip_prefix("application/vnd.docker.image.rootfs.foreign.diff."));
    match base {
        Some("tar") => Ok(Compression::None),
        Some("tar+gzip" | "tar.gzip") => Ok(Compression::Gzip),
        Some("tar+zstd" | "tar.zstd") => Ok(Compression::Zstd),
        _ => Err(ImageError::invalid(format!(
            "layer media type {media_type:?} is not supported (supported: OCI or Docker tar \
             layers, plain, gzip or zstd)"
        ))),
    }
}

/// Picks from an index: the tagged manifest if `tag`, then this platform where platforms are
/// given (descriptors for another platform are out), then the first.
pub(crate) fn pick<'a>(descs: &'a [Descriptor], tag: Option<&str>) -> Result<&'a Descriptor> {
    let tagged: Vec<&Descriptor> = match tag {
        Some(t) => descs
            .iter()
            .filter(|d| d.annotations.get(REF_NAME).map(String::as_str) == Some(t))
            .collect(),
        None => descs.iter().collect(),
    };
    if tagged.is_empty() {
        let tags: Vec<&str> = descs
            .iter()
            .filter_map(|d| d.annotations.get(REF_NAME))
            .map(String::as_str)
            .collect();
        return Err(match tag {
            Some(t) => ImageError::not_found(format!(
                "the OCI layout has no manifest tagged {t:?} (tags: {})",
                if tags.is_empty() {
                    "none".to_string()
                } else {
                    tags.join(", ")
                }
            )),
            None => ImageError::invalid("the OCI index lists no manifests"),
        });
    }
    let fits = |d: &Descriptor| match &d.platform {
        None => true,
        Some(p) => p.os == "linux" && p.architecture == HOST_ARCH,
    };
    let exact = tagged.iter().find(|d| d.platform.is_some() && fits(d));
    exact
        .or_else(|| tagged.iter().find(|d| fits(d)))
        .copied()
        .ok_or_else(|| {
            let found: Vec<String> = tagged
                .iter()
                .filter_map(|d| d.platform.as_ref())
                .map(|p| format!("{}/{}", p.os, p.architecture))
                .collect();
            ImageError::invalid(format!(
                "the image has no manifest for linux/{HOST_ARCH} (found: {})",
                found.join(", ")
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::super::Platform;
    use super::*;

    fn desc(digest: &str, tag: Option<&str>, plat: Option<(&str, &str)>) -> Descriptor {
        Descriptor {
            media_type: MANIFEST_TYPES[0].into(),
            digest: digest.into(),
            size: 1,
            annotations: tag
                .map(|t| (REF_NAME.to_string(), t.to_string()))
                .into_iter()
                .collect(),
            platform: plat.map(|(os, a)| Platform {
                os: os.into(),
                architecture: a.into(),
            }),
        }
    }

    #[test]
    fn picks_tag_then_platform_then_first() {
        let descs = [desc("a", Some("v1"), None), desc("b", Some("v2"), None)];
        assert_eq!(pick(&descs, Some("v2")).unwrap().digest, "b");
        assert_eq!(pick(&descs, None).unwrap().digest, "a");
        assert_eq!(
            pick(&descs, Some("v3")).unwrap_err().kind,
            crate::ErrorKind::NotFound
        );
        let multi = [
            desc("arm", None, Some(("linux", "riscv-none"))),
            desc("att", None, Some(("unknown", "unknown"))),
            desc("host", None, Some(("linux", HOST_ARCH))),
        ];
        assert_eq!(pick(&multi, None).unwrap().digest, "host");
        assert!(pick(&multi[..2], None).is_err());
    }

    #[test]
    fn layer_media_types() {
        assert_eq!(
            layer_compression("application/vnd.oci.image.layer.v1.tar").unwrap(),
            Compression::None
        );
        assert_eq!(
            layer_compression("application/vnd.docker.image.rootfs.diff.tar.gzip").unwrap(),
            Compression::Gzip
        );
        assert_eq!(
            layer_compression("application/vnd.oci.image.layer.v1.tar+zstd").unwrap(),
            Compression::Zstd
        );
        assert!(layer_compression("application/vnd.oci.image.layer.v1.tar+xz").is_err());
        assert!(layer_compression("text/plain").is_err());
    }
}
