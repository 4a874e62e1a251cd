//! The container's root, prepared by the shim inside the container's mount namespace, so every
//! mount made here disappears with the container: nothing to clean up on the host, even after
//! a crash.
//!
//! - An image root is an overlay: the image (shared by every job, never written) under a small
//!   per-job tmpfs layer. Wharf writes into that layer what the job needs and the image lacks:
//!   the mount points of the site's shared paths, the working directory, and the user's
//!   `/etc/passwd` and `/etc/group` entries. Every path is resolved inside the root
//!   (openat2 RESOLVE_IN_ROOT), so a hostile image's symlinks cannot point these writes at the
//!   host.
//! - The host root (`image = "host"`) is bound as it is (pivot_root refuses `/` itself).
//!
//! Either way the result is then made read-only, nosuid and nodev, recursively, in one call;
//! a `writable` job's image root stays writable (nosuid and nodev still): its layer is then as
//! large as the job's memory limit, whose cgroup its pages are charged to. For a writable job
//! that is root inside (`remap_root`), the image is seen through an idmapped mount that maps
//! its owners through the job's user namespace, so the image's root-owned files are the job's
//! root's to change (say, to install a package), and nothing of that reaches the shared image.

use std::io::Write;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::mount::{mount, MsFlags};
use nix::sys::stat::{mkdirat, Mode};

use crate::as_user::SifImage;
use crate::error::{ErrorKind, RuntimeError};
use crate::spec::{ContainerSpec, Identity};
use crate::sys::{self, ATTR_NODEV, ATTR_NOSUID, ATTR_RDONLY};

/// Size of the per-job layer over an image (mount points and identity files only).
const LAYER_SIZE: &str = "size=16m";

/// Prepares the root for `spec` under `job_dir`, in the container's mount namespace (the
/// caller has entered it). `userns` is the job's user namespace, for an idmapped image;
/// `sif`, the SIF file of a SIF job, opened as the user; `opened`, for each user bind opened
/// as the user, its index in `spec.binds` and whether it is a directory (its mount point is
/// made to match what was opened). Returns the path of the container's root.
pub(crate) fn prepare_root(
    spec: &ContainerSpec,
    job_dir: &Path,
    userns: &Path,
    sif: Option<&SifImage>,
    opened: &[(usize, bool)],
) -> Result<PathBuf, RuntimeError> {
    let target = job_dir.join("rootfs");
    mkdir(&target)?;
    if spec.rootfs == Path::new("/") {
        mount(
            Some("/"),
            &target,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .map_err(|e| RuntimeError::sys("binding the host root", e))?;
    } else {
        let mut lower = match (spec.rootfs_partition, sif) {
            (Some(_), Some(sif)) => mount_squashfs(&spec.rootfs, sif, &job_dir.join("image"))?,
            (Some(_), None) => {
                return Err(RuntimeError::new(
                    ErrorKind::InvalidInput,
                    format!(
                        "image {}: the SIF file was not opened",
                        spec.rootfs.display()
                    ),
                ))
            }
            (None, _) => spec.rootfs.clone(),
        };
        let mut layer = Layer {
            size: LAYER_SIZE.into(),
            owner: None,
        };
        if spec.writable {
            layer.size = format!("size={}", spec.memory.unwrap_or(1 << 30));
            if spec.remap_root {
                lower = idmapped_bind(&lower, &job_dir.join("lower"), userns)?;
                layer.owner = Some((spec.uid, spec.gid));
            }
        }
        overlay(&lower, &job_dir.join("layer"), &target, &layer)?;
        let root = open_dir(&target)?;
        check_mount_points(&root)?;
        for (i, b) in spec.binds.iter().enumerate() {
            // A user's source is what was opened as the user; the node's own are its paths.
            let is_dir = match opened.iter().find(|(bind, _)| *bind == i) {
                Some(&(_, is_dir)) => is_dir,
                None => b.source.is_dir(),
            };
            if is_dir {
                mkdir_in_root(&root, &b.destination)?;
            } else {
                touch_in_root(&root, &b.destination)?;
            }
        }
        mkdir_in_root(&root, &spec.cwd)?;
        if let (Some(id), false) = (&spec.identity, spec.remap_root) {
            write_identity(&root, spec.uid, spec.gid, id)?;
        }
    }
    let read_only = if spec.writable && spec.rootfs != Path::new("/") {
        0
    } else {
        ATTR_RDONLY
    };
    set_attrs(&target, read_only | ATTR_NOSUID | ATTR_NODEV)?;
    Ok(target)
}

/// A clone of the mount at `source`, mounted at `target` with its owners mapped through the
/// user namespace at `userns`: a file the image's root owns is owned by that namespace's root.
fn idmapped_bind(source: &Path, target: &Path, userns: &Path) -> Result<PathBuf, RuntimeError> {
    mkdir(target)?;
    let ns = std::fs::File::open(userns).map_err(|e| RuntimeError::io(userns.display(), e))?;
    let tree = sys::clone_tree(None, source.as_os_str(), false).map_err(|e| {
        RuntimeError::io(
            format!("cloning the mount of image {}", source.display()),
            e,
        )
    })?;
    sys::idmap(&tree, &OwnedFd::from(ns), ATTR_RDONLY).map_err(|e| {
        RuntimeError::io(
            format!(
                "mapping the owners of image {} for a writable job that is root inside (its \
                 filesystem must support idmapped mounts; run without --remap-root, or without \
                 --writable)",
                source.display()
            ),
            e,
        )
    })?;
    sys::move_tree_to(&tree, target.as_os_str())
        .map_err(|e| RuntimeError::io("mounting the idmapped image", e))?;
    Ok(target.to_path_buf())
}

/// Mounts the squashfs partition of `sif` (the SIF file at `file`) read-only at `target`.
/// The loop device frees itself when the container's mount namespace goes.
fn mount_squashfs(file: &Path, sif: &SifImage, target: &Path) -> Result<PathBuf, RuntimeError> {
    mkdir(target)?;
    let (dev, _handle) = crate::sandbox::loopdev::attach(&sif.file, sif.offset, sif.size)?;
    let flags = MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    mount(Some(&dev), target, Some("squashfs"), flags, None::<&str>).map_err(|e| {
        RuntimeError::sys(
            format!("mounting the squashfs partition of {}", file.display()),
            e,
        )
    })?;
    Ok(target.to_path_buf())
}

fn mkdir(p: &Path) -> Result<(), RuntimeError> {
    std::fs::create_dir_all(p).map_err(|e| RuntimeError::io(p.display(), e))
}

/// The per-job tmpfs layer over an image.
struct Layer {
    /// tmpfs `size=` option.
    size: String,
    /// Owner of the layer's root directory (the root of the merged tree), when not root.
    owner: Option<(u32, u32)>,
}

/// Mounts `lower` under a fresh tmpfs layer at `target`.
fn overlay(lower: &Path, layer: &Path, target: &Path, opts: &Layer) -> Result<(), RuntimeError> {
    let lower_s = lower.to_str().unwrap_or("");
    if lower_s.is_empty() || lower_s.contains([',', ':']) {
        return Err(RuntimeError::new(
            ErrorKind::InvalidInput,
            format!("image path {} cannot be an overlay layer", lower.display()),
        ));
    }
    mkdir(layer)?;
    mount(
        Some("tmpfs"),
        layer,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(opts.size.as_str()),
    )
    .map_err(|e| RuntimeError::sys("mounting the job's layer", e))?;
    let (upper, work) = (layer.join("upper"), layer.join("work"));
    mkdir(&upper)?;
    mkdir(&work)?;
    if let Some((uid, gid)) = opts.owner {
        std::os::unix::fs::chown(&upper, Some(uid), Some(gid))
            .map_err(|e| RuntimeError::io(upper.display(), e))?;
    }
    let opts = format!(
        "lowerdir={lower_s},upperdir={},workdir={}",
        upper.display(),
        work.display()
    );
    // nosuid and nodev from the start: the shim reads and writes in it as root before the
    // root's attributes are set, and a plain-directory image is not nodev itself.
    mount(
        Some("overlay"),
        target,
        Some("overlay"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(opts.as_str()),
    )
    .map_err(|e| {
        RuntimeError::sys(
            format!("mounting image {} as an overlay", lower.display()),
            e,
        )
    })
}

fn open_dir(p: &Path) -> Result<OwnedFd, RuntimeError> {
    sys::open_fd(p, OFlag::O_DIRECTORY | OFlag::O_RDONLY)
        .map_err(|e| RuntimeError::sys(p.display(), e))
}

/// Opens `path` inside `root`, resolving every component (symlinks included) within it.
pub(crate) fn open_in_root(
    root: &OwnedFd,
    path: &str,
    flags: OFlag,
) -> Result<OwnedFd, nix::Error> {
    let rel = path.trim_start_matches('/');
    let rel = if rel.is_empty() { "." } else { rel };
    let mut how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    // openat2 refuses a mode without O_CREAT.
    if flags.contains(OFlag::O_CREAT) {
        how = how.mode(Mode::from_bits_truncate(0o644));
    }
    let fd = openat2(std::os::fd::AsRawFd::as_raw_fd(root), rel, how)?;
    // SAFETY: a fresh fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Top-level directories the sandbox mounts its own filesystems on, hiding what the root has
/// there (the list the unpacker makes them from). An image where one is a symlink (or not a
/// directory) could aim those mounts elsewhere, so it is refused.
pub use wharf_images::SANDBOX_MOUNT_POINTS;

fn check_mount_points(root: &OwnedFd) -> Result<(), RuntimeError> {
    for name in SANDBOX_MOUNT_POINTS {
        let st = nix::sys::stat::fstatat(
            Some(std::os::fd::AsRawFd::as_raw_fd(root)),
            name,
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        );
        let is_dir = st.is_ok_and(|s| s.st_mode & libc::S_IFMT == libc::S_IFDIR);
        if !is_dir {
            return Err(RuntimeError::new(
                ErrorKind::InvalidInput,
                format!("image refused: /{name} must be a directory (it is a symlink, a file or missing)"),
            ));
        }
    }
    Ok(())
}

/// `mkdir -p` of `path` inside `root`, every component resolved inside it.
pub(crate) fn mkdir_in_root(root: &OwnedFd, path: &str) -> Result<(), RuntimeError> {
    let mut done = String::new();
    for comp in path.split('/').filter(|c| !c.is_empty() && *c != ".") {
        if comp == ".." {
            return Err(RuntimeError::new(
                ErrorKind::InvalidInput,
                format!("path {path} climbs with `..`"),
            ));
        }
        let parent = open_in_root(root, &done, OFlag::O_PATH | OFlag::O_DIRECTORY)
            .map_err(|e| RuntimeError::sys(format!("creating {path} in the image"), e))?;
        match mkdirat(
            Some(std::os::fd::AsRawFd::as_raw_fd(&parent)),
            comp,
            Mode::from_bits_truncate(0o755),
        ) {
            Ok(()) | Err(nix::Error::EEXIST) => {}
            Err(e) => {
                return Err(RuntimeError::sys(
                    format!("creating {path} in the image"),
                    e,
                ))
            }
        }
        done.push('/');
        done.push_str(comp);
    }
    Ok(())
}

/// Creates an empty file at `path` inside `root` (a mount point for a bound file), parents
/// included, unless something is there. Whatever is there is never opened: an image's FIFO
/// would hold an open (even a non-blocking one for writing, ENXIO aside), and the mount point
/// is reached later by an `O_PATH` descriptor only.
pub(crate) fn touch_in_root(root: &OwnedFd, path: &str) -> Result<(), RuntimeError> {
    let parent = Path::new(path)
        .parent()
        .and_then(|p| p.to_str())
        .unwrap_or("/");
    mkdir_in_root(root, parent)?;
    // O_EXCL: only ever a fresh file; something already there is left as it is.
    match open_in_root(
        root,
        path,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK,
    ) {
        Ok(_) | Err(nix::Error::EEXIST) => Ok(()),
        Err(e) => Err(RuntimeError::sys(
            format!("creating {path} in the image"),
            e,
        )),
    }
}

/// The text of the image's file at `path`, when it is a regular file. Nothing else is ever
/// opened for reading: the path is resolved to an `O_PATH` descriptor, checked on that
/// descriptor, and only a regular file is opened again (through the descriptor, never the
/// path). A FIFO in a user's image would hold the open, as root, past the job's time limit;
/// a device's open could act on the device. Anything but a regular file (missing, a FIFO, a
/// device, a directory, unreadable) reads as absent: the job's layer gets a fresh file
/// instead (see [`replace_in_root`]). A file over [`MAX_IDENTITY_FILE`] refuses the image:
/// this is root reading, outside the job's memory limit, and a sparse file of terabytes
/// costs its maker nothing.
fn read_regular_in_root(root: &OwnedFd, path: &str) -> Result<Option<String>, RuntimeError> {
    let Ok(at) = open_in_root(root, path, OFlag::O_PATH) else {
        return Ok(None);
    };
    let Ok(Some(file)) = sys::reopen_regular(&at, OFlag::O_RDONLY) else {
        return Ok(None);
    };
    let too_large = || {
        RuntimeError::new(
            ErrorKind::InvalidInput,
            format!(
                "image refused: its {path} is over {} MiB; no user list is that long",
                MAX_IDENTITY_FILE >> 20
            ),
        )
    };
    if file.metadata().is_ok_and(|m| m.len() > MAX_IDENTITY_FILE) {
        return Err(too_large());
    }
    let mut text = String::new();
    match std::io::Read::read_to_string(
        &mut std::io::Read::take(file, MAX_IDENTITY_FILE + 1),
        &mut text,
    ) {
        Ok(n) if n as u64 > MAX_IDENTITY_FILE => Err(too_large()),
        Ok(_) => Ok(Some(text)),
        Err(_) => Ok(None),
    }
}

/// Largest `/etc/passwd` or `/etc/group` of an image that is read, bytes.
pub const MAX_IDENTITY_FILE: u64 = 16 << 20;

/// Writes `text` as a fresh regular file at `path` inside `root` (in the job's layer of an
/// image root), replacing whatever the image had there: it is unlinked first (the overlay
/// whites it out; the image is never written) and the new file is created with `O_EXCL`, so
/// nothing already there (a FIFO, a device, a symlink) is ever opened.
fn replace_in_root(root: &OwnedFd, path: &str, text: &str) -> Result<(), RuntimeError> {
    let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
    let dir = open_in_root(root, dir, OFlag::O_PATH | OFlag::O_DIRECTORY)
        .map_err(|e| RuntimeError::sys(format!("writing {path} in the image"), e))?;
    let dirfd = std::os::fd::AsRawFd::as_raw_fd(&dir);
    match nix::unistd::unlinkat(Some(dirfd), name, nix::unistd::UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(nix::Error::ENOENT) => {}
        Err(e) => {
            return Err(RuntimeError::new(
                ErrorKind::InvalidInput,
                format!(
                    "image refused: its {path} cannot be replaced by the job's own ({e}); it \
                     must be a regular file"
                ),
            ))
        }
    }
    let fd = nix::fcntl::openat(
        Some(dirfd),
        name,
        OFlag::O_WRONLY
            | OFlag::O_CREAT
            | OFlag::O_EXCL
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o644),
    )
    .map_err(|e| RuntimeError::sys(format!("writing {path} in the image"), e))?;
    // SAFETY: a fresh descriptor we own.
    std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) })
        .write_all(text.as_bytes())
        .map_err(|e| RuntimeError::io(format!("writing {path}"), e))
}

/// Adds the user and their groups to the image's `/etc/passwd` and `/etc/group` (fresh files
/// in the job's layer), replacing entries with the same name or id. An image whose file is not
/// a regular file (a FIFO, a device) is taken as having none.
fn write_identity(root: &OwnedFd, uid: u32, gid: u32, id: &Identity) -> Result<(), RuntimeError> {
    mkdir_in_root(root, "/etc")?;
    let read = |name: &str| read_regular_in_root(root, name).map(Option::unwrap_or_default);
    let keep = |text: &str, names: &[&str], ids: &[u32]| -> String {
        text.lines()
            .filter(|l| {
                let mut f = l.split(':');
                let (name, id) = (
                    f.next().unwrap_or(""),
                    f.nth(1).and_then(|v| v.parse::<u32>().ok()),
                );
                !names.contains(&name) && !id.is_some_and(|i| ids.contains(&i))
            })
            .map(|l| format!("{l}\n"))
            .collect()
    };
    let mut passwd = keep(&read("/etc/passwd")?, &[&id.user], &[uid]);
    if !passwd.lines().any(|l| l.starts_with("root:")) && uid != 0 {
        passwd.push_str("root:x:0:0:root:/root:/bin/sh\n");
    }
    passwd.push_str(&format!("{}:x:{uid}:{gid}::{}:/bin/sh\n", id.user, id.home));
    let names: Vec<&str> = id.groups.iter().map(|(_, n)| n.as_str()).collect();
    let gids: Vec<u32> = id.groups.iter().map(|(g, _)| *g).collect();
    let mut group = keep(&read("/etc/group")?, &names, &gids);
    for (g, name) in &id.groups {
        let members = if *g == gid {
            String::new()
        } else {
            id.user.clone()
        };
        group.push_str(&format!("{name}:x:{g}:{members}\n"));
    }
    for (file, text) in [("/etc/passwd", passwd), ("/etc/group", group)] {
        replace_in_root(root, file, &text)?;
    }
    Ok(())
}

/// Sets mount attributes (read-only, nosuid, nodev) on `target` and everything under it.
fn set_attrs(target: &Path, attrs: u64) -> Result<(), RuntimeError> {
    sys::set_attrs_at(target.as_os_str(), attrs)
        .map_err(|e| RuntimeError::io("making the root read-only", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` on a thread and fails (rather than hangs) when it waits more than 10 s.
    fn within_seconds<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(f()));
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("waited on something in the image")
    }

    #[test]
    fn identity_files_and_mount_points_of_an_image_are_never_opened_unless_regular() {
        let dir = tempfile::tempdir().unwrap();
        let etc = dir.path().join("etc");
        std::fs::create_dir(&etc).unwrap();
        // A FIFO nobody writes to, where the identity file and a file bind's mount point go.
        for name in ["passwd", "hosts"] {
            nix::unistd::mkfifo(&etc.join(name), Mode::from_bits_truncate(0o644)).unwrap();
        }
        std::fs::write(etc.join("group"), "staff:x:50:\nold:x:4300:\n").unwrap();
        let root = open_dir(dir.path()).unwrap();
        let id = Identity {
            user: "alice".into(),
            home: "/home/alice".into(),
            groups: vec![(4300, "alice".into())],
        };
        within_seconds(move || {
            write_identity(&root, 4300, 4300, &id).unwrap();
            touch_in_root(&root, "/etc/hosts").unwrap();
        });
        let kind = |name: &str| {
            std::fs::symlink_metadata(etc.join(name))
                .unwrap()
                .file_type()
        };
        assert!(kind("passwd").is_file(), "the FIFO is replaced by a file");
        assert_eq!(
            std::fs::read_to_string(etc.join("passwd")).unwrap(),
            "root:x:0:0:root:/root:/bin/sh\nalice:x:4300:4300::/home/alice:/bin/sh\n"
        );
        assert_eq!(
            std::fs::read_to_string(etc.join("group")).unwrap(),
            "staff:x:50:\nalice:x:4300:\n"
        );
        use std::os::unix::fs::FileTypeExt;
        assert!(
            kind("hosts").is_fifo(),
            "a mount point already there is left"
        );
    }

    /// An image's sparse `/etc/group` of a terabyte costs its maker nothing; read whole, as
    /// root outside the job's memory limit, it took the node's memory. It refuses the image,
    /// unread, and the image's files are left as they were.
    #[test]
    fn a_huge_identity_file_refuses_the_image_unread() {
        let dir = tempfile::tempdir().unwrap();
        let etc = dir.path().join("etc");
        std::fs::create_dir(&etc).unwrap();
        std::fs::write(etc.join("passwd"), "root:x:0:0::/root:/bin/sh\n").unwrap();
        std::fs::File::create(etc.join("group"))
            .unwrap()
            .set_len(1 << 40)
            .unwrap();
        let root = open_dir(dir.path()).unwrap();
        let id = Identity {
            user: "alice".into(),
            home: "/".into(),
            groups: vec![(4300, "alice".into())],
        };
        let err = within_seconds(move || write_identity(&root, 4300, 4300, &id))
            .unwrap_err()
            .to_string();
        assert!(err.contains("/etc/group is over 16 MiB"), "{err}");
        assert_eq!(std::fs::metadata(etc.join("group")).unwrap().len(), 1 << 40);
    }

    #[test]
    fn an_identity_file_that_is_a_directory_is_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("etc/passwd/x")).unwrap();
        let root = open_dir(dir.path()).unwrap();
        let id = Identity {
            user: "alice".into(),
            home: "/".into(),
            groups: vec![(4300, "alice".into())],
        };
        let err = write_identity(&root, 4300, 4300, &id)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("/etc/passwd cannot be replaced") && err.contains("regular file"),
            "{err}"
        );
    }
}
