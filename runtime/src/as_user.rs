//! What the shim opens as the job's user before it builds the sandbox: the SIF image and the
//! user's bind sources. Each is opened once, with the user's filesystem ids and groups, then
//! checked as that descriptor, and that very descriptor is what the sandbox uses (the loop
//! device's backing file, the bind's mount tree). Nothing is checked by one path and used by
//! another, so a symlink or a rename between check and use changes nothing.
//!
//! ```text
//!  SIF:  open(path) as the user ─▶ fstat: a regular file ─▶ read the SIF table from the fd ─▶
//!        LOOP_CONFIGURE(fd)
//!  bind: open(allowed root, O_PATH) as the user ─▶ openat2(rel, BENEATH | NO_SYMLINKS) ─▶
//!        fstat: a directory or a file ─▶ open_tree(fd, CLONE | RECURSIVE) as root ─▶ the
//!        init moves that tree onto its mount point
//! ```
//!
//! The shim is single-threaded and real root, so it may switch its own filesystem ids and
//! groups for the length of one open ([`AsUser::run`]); with a non-zero fsuid the kernel drops
//! the capabilities that would let root past a permission check.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstat, SFlag};
use nix::unistd::{getgroups, setfsgid, setfsuid, setgroups, Gid, Uid};

use crate::error::{ErrorKind, RuntimeError};
use crate::spec::{Bind, ContainerSpec};
use crate::sys;

/// The job's user, for filesystem permission checks.
pub(crate) struct AsUser {
    uid: u32,
    gid: u32,
    groups: Vec<Gid>,
}

impl AsUser {
    /// The user of `spec`, with their primary and supplementary groups.
    pub(crate) fn of(spec: &ContainerSpec) -> AsUser {
        let groups = spec
            .groups
            .iter()
            .chain([&spec.gid])
            .map(|&g| Gid::from_raw(g))
            .collect();
        AsUser {
            uid: spec.uid,
            gid: spec.gid,
            groups,
        }
    }

    /// Runs `f` with the user's filesystem ids and groups, then takes root's back, whatever
    /// `f` returned. Only for a single-threaded real-root process: setfsuid and setfsgid act
    /// on the calling thread.
    pub(crate) fn run<T>(&self, f: impl FnOnce() -> T) -> Result<T, RuntimeError> {
        let saved = getgroups().map_err(|e| RuntimeError::sys("getgroups", e))?;
        setgroups(&self.groups).map_err(|e| RuntimeError::sys("taking the user's groups", e))?;
        setfsgid(Gid::from_raw(self.gid));
        setfsuid(Uid::from_raw(self.uid));
        // setfsuid reports the previous id, never a failure: asking again tells whether it took.
        let took = setfsuid(Uid::from_raw(self.uid)).as_raw() == self.uid
            && setfsgid(Gid::from_raw(self.gid)).as_raw() == self.gid;
        let result = took.then(f);
        setfsuid(Uid::from_raw(0));
        setfsgid(Gid::from_raw(0));
        setgroups(&saved).map_err(|e| RuntimeError::sys("restoring the shim's groups", e))?;
        result.ok_or_else(|| {
            RuntimeError::new(
                ErrorKind::PermissionDenied,
                format!("cannot take the filesystem ids of uid {}", self.uid),
            )
        })
    }
}

/// A SIF file opened as the job's user, and its primary system partition as read from that
/// descriptor.
pub(crate) struct SifImage {
    /// The file, opened read-only as the user.
    pub file: File,
    /// Byte offset of the squashfs partition.
    pub offset: u64,
    /// Its size in bytes.
    pub size: u64,
}

/// Opens the SIF file at `path` as `user`, refusing anything but a regular file the user may
/// read, and finds its partition in that descriptor.
pub(crate) fn open_sif(path: &Path, user: &AsUser) -> Result<SifImage, RuntimeError> {
    let denied = |e: nix::Error| {
        RuntimeError::sys(
            format!(
                "image {}: cannot be opened by uid {} (the job's user must be able to read it, \
                 and to search every directory on the way, symlinks' targets included)",
                path.display(),
                user.uid
            ),
            e,
        )
    };
    // Looked at through an O_PATH descriptor, and opened (through it) only when a regular
    // file: a FIFO planted at the path must not hold the launch, and a device's open would
    // run its driver for the shim, which keeps its capabilities while it acts as the user.
    let file = user
        .run(|| {
            let at = sys::open_fd(path, OFlag::O_PATH)?;
            sys::reopen_regular(&at, OFlag::O_RDONLY)
        })?
        .map_err(denied)?
        .ok_or_else(|| {
            RuntimeError::new(
                ErrorKind::InvalidInput,
                format!("image {}: not a regular file", path.display()),
            )
        })?;
    let part = wharf_images::sif::primary_partition_of(&file).map_err(|e| {
        RuntimeError::new(ErrorKind::InvalidInput, format!("{}: {e}", path.display()))
    })?;
    Ok(SifImage {
        file,
        offset: part.offset,
        size: part.size,
    })
}

/// A user's bind source, resolved and cloned: the mount tree the init attaches.
#[derive(Debug)]
pub(crate) struct BindTree {
    /// Index of the bind in the spec's `binds`.
    pub bind: usize,
    /// A detached copy of the source's mounts (`open_tree(OPEN_TREE_CLONE | AT_RECURSIVE)`).
    pub tree: OwnedFd,
    /// The source is a directory (else a file): what its mount point must be.
    pub is_dir: bool,
}

/// Resolves every user bind of `spec` (those with `beneath`) as `user` and clones it.
pub(crate) fn open_user_binds(
    spec: &ContainerSpec,
    user: &AsUser,
) -> Result<Vec<BindTree>, RuntimeError> {
    let mut trees = Vec::new();
    for (i, b) in spec.binds.iter().enumerate() {
        if let Some(root) = &b.beneath {
            trees.push(open_user_bind(i, b, root, user)?);
        }
    }
    Ok(trees)
}

fn open_user_bind(
    index: usize,
    b: &Bind,
    root: &Path,
    user: &AsUser,
) -> Result<BindTree, RuntimeError> {
    let src = b.source.display();
    let refused = |why: String| {
        RuntimeError::new(
            ErrorKind::InvalidInput,
            format!("mount {src}:{}: {why}", b.destination),
        )
    };
    let rel = b
        .source
        .strip_prefix(root)
        .map_err(|_| refused(format!("not under {}", root.display())))?;
    let rel = if rel.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        rel.to_path_buf()
    };
    let opened = user.run(|| -> Result<OwnedFd, (String, nix::Error)> {
        let top = sys::open_fd(root, OFlag::O_PATH | OFlag::O_DIRECTORY)
            .map_err(|e| (root.display().to_string(), e))?;
        // No symlink, no magic link, nothing above the allowed root: what resolves is under it
        // by construction, and reachable by the user since they walked it.
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
            .resolve(
                ResolveFlag::RESOLVE_BENEATH
                    | ResolveFlag::RESOLVE_NO_SYMLINKS
                    | ResolveFlag::RESOLVE_NO_MAGICLINKS,
            );
        let fd = openat2(top.as_raw_fd(), rel.as_path(), how).map_err(|e| (src.to_string(), e))?;
        // SAFETY: a fresh descriptor we own.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    })?;
    let fd = opened.map_err(|(what, e)| match e {
        nix::Error::ELOOP => refused(format!(
            "{what} is, or passes through, a symlink; give the path it points to, under {}",
            root.display()
        )),
        nix::Error::EXDEV => refused(format!("{what} leaves {}", root.display())),
        nix::Error::EACCES | nix::Error::EPERM => {
            refused(format!("you cannot reach {what} on this node"))
        }
        e => refused(format!("{what}: {e}")),
    })?;
    let is_dir = match kind(&fd)? {
        SFlag::S_IFDIR => true,
        SFlag::S_IFREG => false,
        _ => return Err(refused("not a directory or a regular file".into())),
    };
    let tree = sys::clone_tree(Some(fd.as_fd()), std::ffi::OsStr::new(""), true)
        .map_err(|e| RuntimeError::io(format!("binding {src}"), e))?;
    Ok(BindTree {
        bind: index,
        tree,
        is_dir,
    })
}

/// The file type of the object open at `fd`.
fn kind(fd: &OwnedFd) -> Result<SFlag, RuntimeError> {
    let st = fstat(fd.as_raw_fd()).map_err(|e| RuntimeError::sys("fstat", e))?;
    Ok(SFlag::from_bits_truncate(st.st_mode & libc::S_IFMT))
}

/// The user's bind trees attached, in the node's mount namespace, at `DIR/binds/N` inside a
/// root-only directory, for the Docker engine, which binds by path: it is given these paths,
/// which the user can neither reach nor change. Detached when dropped, and by [`unstage`]
/// before a job directory is removed.
pub(crate) struct Staged {
    dir: PathBuf,
}

/// Opens the user's binds of `spec` as `user` and stages them under the job directory `dir`
/// for the engine; returns the spec with those binds' sources replaced by the staged paths.
pub(crate) fn stage_for_engine(
    dir: &Path,
    spec: &ContainerSpec,
    user: &AsUser,
) -> Result<(ContainerSpec, Staged), RuntimeError> {
    crate::sandbox::plan::check_destinations(spec)?;
    crate::sandbox::plan::check_not_nested(spec)?;
    let trees = open_user_binds(spec, user)?;
    let staged = Staged {
        dir: dir.join("binds"),
    };
    let mut spec = spec.clone();
    if trees.is_empty() {
        return Ok((spec, staged));
    }
    // Root's alone from the start: another user must not reach a bind through it.
    std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
        .create(&staged.dir)
        .map_err(|e| RuntimeError::io(staged.dir.display(), e))?;
    for t in trees {
        let at = staged.dir.join(t.bind.to_string());
        let made = if t.is_dir {
            std::fs::create_dir(&at)
        } else {
            std::fs::File::create(&at).map(drop)
        };
        made.map_err(|e| RuntimeError::io(at.display(), e))?;
        let ro = if spec.binds[t.bind].read_only {
            sys::ATTR_RDONLY
        } else {
            0
        };
        sys::set_attrs(&t.tree, ro | sys::ATTR_NOSUID | sys::ATTR_NODEV)
            .map_err(|e| RuntimeError::io(format!("restricting a bind at {}", at.display()), e))?;
        sys::move_tree_to(&t.tree, at.as_os_str())
            .map_err(|e| RuntimeError::io(format!("staging a bind at {}", at.display()), e))?;
        spec.binds[t.bind].source = at;
    }
    Ok((spec, staged))
}

impl Drop for Staged {
    fn drop(&mut self) {
        unstage_dir(&self.dir);
    }
}

/// Detaches and removes whatever a shim staged for the engine in the job directory `dir`
/// (nothing when it staged nothing). Must run before the directory is removed: a recursive
/// removal would otherwise descend into the user's bound directories.
pub(crate) fn unstage(dir: &Path) {
    unstage_dir(&dir.join("binds"));
}

fn unstage_dir(binds: &Path) {
    let Ok(entries) = std::fs::read_dir(binds) else {
        return;
    };
    for e in entries.flatten() {
        let at = e.path();
        // Every mount stacked there, until the mount point itself is left.
        while nix::mount::umount2(&at, nix::mount::MntFlags::MNT_DETACH).is_ok() {}
        let _ = std::fs::remove_dir(&at).or_else(|_| std::fs::remove_file(&at));
    }
    let _ = std::fs::remove_dir(binds);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A FIFO at the SIF's path, whose writer waits in its open: an open for reading, even
    /// one refused right after by its type, would let the writer through. Only a regular
    /// file is ever opened, so the writer still waits.
    #[test]
    fn only_a_regular_file_is_opened_as_a_sif() {
        let root = nix::unistd::geteuid().is_root();
        if !crate::test_can_run(
            "only_a_regular_file_is_opened_as_a_sif",
            (!root).then_some("needs root"),
        ) {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let fifo = tmp.path().join("image.sif");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let writer = {
            let fifo = fifo.clone();
            std::thread::spawn(move || {
                let opened =
                    nix::fcntl::open(&fifo, OFlag::O_WRONLY, nix::sys::stat::Mode::empty());
                tx.send(opened.is_ok()).unwrap();
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(200));
        let spec = crate::conformance::template("sif", Path::new("/"), 0, 0);
        let Err(err) = open_sif(&fifo, &AsUser::of(&spec)) else {
            panic!("a FIFO was taken as a SIF");
        };
        assert!(err.message.contains("not a regular file"), "{err}");
        let opened = rx.recv_timeout(std::time::Duration::from_millis(500));
        // Let the writer go whatever happened.
        let _reader = nix::fcntl::open(
            &fifo,
            OFlag::O_RDONLY | OFlag::O_NONBLOCK,
            nix::sys::stat::Mode::empty(),
        );
        writer.join().unwrap();
        assert!(opened.is_err(), "the FIFO was opened for reading");
    }
}
