//! Wharf's local image store: imports root filesystems from tarballs, directories and OCI
//! image layouts, unpacked so that no entry can write outside the image.
//!
//! Every archive entry, whatever the source, goes through one extractor that
//!
//! - normalizes its path lexically (no NUL, no climbing `..`, bounded length and depth),
//! - opens the parent directory with `openat2(RESOLVE_IN_ROOT)`, creating missing
//!   directories one component at a time, so `..` and symlinks resolve inside the root,
//! - creates the last component relative to that descriptor with `O_NOFOLLOW`/`O_EXCL`,
//!   after unlinking whatever non-directory was there, so a symlink planted by an earlier
//!   entry or layer is replaced, never written through,
//! - resolves hard link targets inside the root with no symlink on the way,
//! - skips devices, FIFOs and sockets, and applies OCI whiteouts in layers.
//!
//! Directories are archived on the fly into the same extractor. Every OCI blob is checked
//! against its digest and every layer's uncompressed stream against the config's `diff_id`;
//! a compressed stream must end cleanly (checksums right, nothing after it). Every archive is
//! scanned against [`Limits`] before anything is written, so bombs are refused in seconds,
//! and an import either publishes a complete image or leaves the store as it was. The store
//! is private to its owner (see [`ImageStore`]).
//!
//! ```no_run
//! use std::path::{Path, PathBuf};
//! use wharf_images::{ErrorKind, ImageStore};
//!
//! let store = ImageStore::open(PathBuf::from("/var/lib/wharf/images"))?;
//! store.import(Path::new("/srv/layouts/pytorch:24.01"), "pytorch:24.01")?;
//! for image in store.list()? {
//!     println!("{} {} {} bytes", image.name, image.digest, image.size);
//! }
//! match store.get("missing") {
//!     Err(e) if e.kind == ErrorKind::NotFound => println!("{e}"),
//!     other => println!("{other:?}"),
//! }
//! # Ok::<(), wharf_images::ImageError>(())
//! ```

mod cache;
mod dirsource;
mod entry_path;
mod error;
mod extract;
mod fsutil;
mod layers;
mod limits;
mod name;
mod oci;
mod pull;
pub mod registry;
mod rootfs;
mod shared;
mod shared_quota;
pub mod sif;
mod source;
mod stack;
mod staging;
mod store;
mod stream;

pub use cache::{CachedLayer, ImageStatus, Pin, Removed};
pub use error::{ErrorKind, ImageError};
pub use limits::Limits;
pub use name::{validate_name, MAX_NAME_LEN, RESERVED_HOST};
pub use pull::{check_access, PullEvent};
pub use rootfs::SANDBOX_MOUNT_POINTS;
pub use shared::SharedCache;
pub use store::{ImageInfo, ImageStore};
pub use wharf_api::image_ref::ImageRef;
