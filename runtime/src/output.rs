//! The job's output files, opened by the shim **as the user** (their fs ids and groups), so a
//! path they could not write, or a symlink they planted, cannot be turned against root.
//!
//! Opening never waits on something the user controls, and opens nothing but a regular file
//! or `/dev/null`: the path is looked at through an `O_PATH` descriptor, and only those are
//! opened (non-blocking: a file under a lease answers EWOULDBLOCK instead of waiting for the
//! lease to be broken); a FIFO, socket or other device is refused without being opened.
//! A leased file is tried again until the kernel has broken the lease (within
//! `fs.lease-break-time`), the job is cancelled or its time limit passes.
//!
//! ```text
//!  as the user: O_PATH|O_NOFOLLOW ─▶ fstat: a regular file or /dev/null? reopen it through
//!  the descriptor O_WRONLY|O_NONBLOCK|O_NOCTTY; missing: O_CREAT|O_EXCL, 0600; else refused
//!    ├─ EWOULDBLOCK (a lease) ─▶ stop asked? ─▶ no: wait 50 ms, again
//!    └─ fstat ─▶ regular: truncate (unless appending), 0600 (if the user's) ─┐
//!             ─▶ /dev/null's device number ───────────────────────┼─▶ blocking again ─▶ job
//!             ─▶ anything else: refused, with what it is ─────────┘
//! ```

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::sys::stat::{fstat, Mode, SFlag};

use crate::as_user::AsUser;
use crate::error::{ErrorKind, RuntimeError};
use crate::jobdir::JobDir;
use crate::shim::{Abort, Stop};
use crate::spec::ContainerSpec;

/// How long to wait between two tries at a file under a lease.
const LEASE_RETRY: Duration = Duration::from_millis(50);

/// Opens the job's stdout and stderr files (one descriptor twice when they are the same
/// path). `stop` is asked while a lease holds a file: a cancel or the time limit ends the
/// wait. A captured stream goes to its file in the job directory `jd` instead, which root
/// makes (the user never names it).
pub(crate) fn open_outputs(
    spec: &ContainerSpec,
    jd: &JobDir,
    stop: &dyn Fn() -> Option<Stop>,
) -> Result<(OwnedFd, OwnedFd), Abort> {
    let null = nix::sys::stat::stat("/dev/null")
        .map_err(|e| RuntimeError::sys("/dev/null", e))?
        .st_rdev;
    let stdout = match spec.capture_stdout {
        true => open_captured(&jd.captured(false))?,
        false => open_output(&spec.stdout, spec, null, stop)?,
    };
    let stderr = if spec.capture_stderr {
        open_captured(&jd.captured(true))?
    } else if spec.stderr == spec.stdout && !spec.capture_stdout {
        stdout.try_clone().map_err(|e| RuntimeError::io("dup", e))?
    } else {
        open_output(&spec.stderr, spec, null, stop)?
    };
    Ok((stdout, stderr))
}

/// A captured stream's file: root's, private, in the job directory (which only root writes).
fn open_captured(path: &Path) -> Result<OwnedFd, Abort> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| RuntimeError::io(path.display(), e))?;
    Ok(file.into())
}

fn open_output(
    path: &Path,
    spec: &ContainerSpec,
    null: libc::dev_t,
    stop: &dyn Fn() -> Option<Stop>,
) -> Result<OwnedFd, Abort> {
    loop {
        match AsUser::of(spec).run(|| open_once(path, spec.uid, null, spec.append_output))? {
            // A lease being broken, or a file that appeared between two looks.
            Err(Errno::EWOULDBLOCK | Errno::EEXIST) => {}
            Ok(Ok(fd)) => return Ok(fd),
            Ok(Err(refused)) => return Err(refused.into()),
            Err(e) => return Err(refused(path, spec.uid, e).into()),
        }
        if let Some(why) = stop() {
            return Err(Abort::Stop(why));
        }
        std::thread::sleep(LEASE_RETRY);
    }
}

/// One try, as the user: the descriptor, a refusal (a file of the wrong type), or the errno.
/// Whatever is at the path is looked at through an `O_PATH` descriptor first, and only a
/// regular file or `/dev/null` is opened for writing (through that descriptor): the open of
/// any other device would run the driver's code for the shim, which keeps its capabilities
/// while it acts as the user. A missing file is created fresh (`O_EXCL`); EEXIST (something
/// appeared meanwhile) is tried again like a lease.
fn open_once(
    path: &Path,
    uid: u32,
    null: libc::dev_t,
    append: bool,
) -> Result<Result<OwnedFd, RuntimeError>, Errno> {
    let fd = match crate::sys::open_fd(path, OFlag::O_PATH | OFlag::O_NOFOLLOW) {
        Ok(at) => {
            let st = fstat(at.as_raw_fd())?;
            match SFlag::from_bits_truncate(st.st_mode & libc::S_IFMT) {
                SFlag::S_IFREG => {}
                SFlag::S_IFCHR if st.st_rdev == null => {}
                SFlag::S_IFLNK => return Err(Errno::ELOOP),
                other => return Ok(Err(wrong_type(path, other))),
            }
            let mode = if append {
                OFlag::O_WRONLY | OFlag::O_APPEND
            } else {
                OFlag::O_WRONLY
            };
            crate::sys::reopen(&at, mode)?
        }
        Err(Errno::ENOENT) => {
            let flags = OFlag::O_WRONLY
                | OFlag::O_CREAT
                | OFlag::O_EXCL
                | OFlag::O_NONBLOCK
                | OFlag::O_NOFOLLOW
                | OFlag::O_NOCTTY
                | OFlag::O_CLOEXEC;
            let fd = nix::fcntl::open(path, flags, Mode::from_bits_truncate(0o600))?;
            // SAFETY: a fresh descriptor we own.
            unsafe { OwnedFd::from_raw_fd(fd) }
        }
        Err(e) => return Err(e),
    };
    // What was opened is what was checked (the same inode); checked again all the same.
    let st = fstat(fd.as_raw_fd())?;
    match SFlag::from_bits_truncate(st.st_mode & libc::S_IFMT) {
        SFlag::S_IFREG => {
            if !append {
                nix::unistd::ftruncate(&fd, 0)?;
            }
            // Private even if it existed with wider permissions; a file of someone else's
            // that the user may write keeps its mode (fchmod as the user is refused).
            if st.st_uid == uid {
                nix::sys::stat::fchmod(fd.as_raw_fd(), Mode::from_bits_truncate(0o600))?;
            }
        }
        SFlag::S_IFCHR if st.st_rdev == null => {}
        other => return Ok(Err(wrong_type(path, other))),
    }
    // The job gets an ordinary, blocking descriptor.
    // (Status flags are set whole: O_APPEND stays when appending.)
    let keep = if append {
        OFlag::O_APPEND
    } else {
        OFlag::empty()
    };
    fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(keep))?;
    Ok(Ok(fd))
}

fn wrong_type(path: &Path, kind: SFlag) -> RuntimeError {
    let what = match kind {
        SFlag::S_IFIFO => "a named pipe (FIFO)",
        SFlag::S_IFCHR => "a character device other than /dev/null",
        SFlag::S_IFBLK => "a block device",
        SFlag::S_IFSOCK => "a socket",
        SFlag::S_IFDIR => "a directory",
        _ => "not a regular file",
    };
    RuntimeError::new(
        ErrorKind::InvalidInput,
        format!(
            "output file {} is {what}: a job's output goes only to a regular file or /dev/null; \
             choose another --output/--error path",
            path.display()
        ),
    )
}

fn refused(path: &Path, uid: u32, e: Errno) -> RuntimeError {
    let p = path.display();
    let message = match e {
        Errno::ENXIO => format!(
            "output file {p} is a named pipe (FIFO) or socket: a job's output goes only to a \
             regular file or /dev/null; choose another --output/--error path"
        ),
        Errno::ELOOP => format!(
            "output file {p} is a symbolic link: output is never written through one; remove \
             the link or choose another --output/--error path"
        ),
        Errno::EISDIR => {
            format!("output file {p} is a directory; choose another --output/--error path")
        }
        e => format!("cannot create output file {p} as uid {uid}: {}", e.desc()),
    };
    let kind = match e {
        Errno::EACCES | Errno::EPERM => ErrorKind::PermissionDenied,
        Errno::ENOENT => ErrorKind::NotFound,
        _ => ErrorKind::InvalidInput,
    };
    RuntimeError::new(kind, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn spec_in(dir: &Path, name: &str) -> ContainerSpec {
        // Root's own ids: these tests check types and waits, not permissions (the end-to-end
        // tests open as real users).
        let mut s = crate::conformance::template("out", Path::new("/"), 0, 0);
        s.stdout = dir.join(name);
        s.stderr = s.stdout.clone();
        s
    }

    /// Opening as the user changes the fs ids and groups, which needs root.
    fn as_root(test: &str) -> bool {
        let root = nix::unistd::geteuid().is_root();
        crate::test_can_run(test, (!root).then_some("needs root"))
    }

    /// No captured stream in these tests: their job directory is never looked at.
    fn no_dir() -> JobDir {
        JobDir::new("/nonexistent".into())
    }

    fn never() -> Option<Stop> {
        None
    }

    fn message(r: Result<(OwnedFd, OwnedFd), Abort>) -> String {
        match r {
            Err(Abort::Failed(e)) => e.message,
            Err(Abort::Stop(s)) => panic!("stopped: {s:?}"),
            Ok(_) => panic!("opened"),
        }
    }

    #[test]
    fn a_fifo_is_refused_at_once_with_or_without_a_reader() {
        if !as_root("a_fifo_is_refused_at_once_with_or_without_a_reader") {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let fifo = tmp.path().join("fifo");
        nix::unistd::mkfifo(&fifo, Mode::from_bits_truncate(0o666)).unwrap();
        let spec = spec_in(tmp.path(), "fifo");
        let why = message(open_outputs(&spec, &no_dir(), &never));
        assert!(why.contains("is a named pipe (FIFO)"), "{why}");
        // With a reader the open succeeds; the type check refuses it.
        let _reader =
            nix::fcntl::open(&fifo, OFlag::O_RDONLY | OFlag::O_NONBLOCK, Mode::empty()).unwrap();
        let why = message(open_outputs(&spec, &no_dir(), &never));
        assert!(why.contains("is a named pipe (FIFO)"), "{why}");
    }

    /// A FIFO whose reader waits in its open: an open for writing, even one refused right
    /// after by its type, would let the reader through. Nothing but a regular file or
    /// `/dev/null` is ever opened, so the reader still waits.
    #[test]
    fn nothing_but_a_regular_file_or_dev_null_is_ever_opened() {
        if !as_root("nothing_but_a_regular_file_or_dev_null_is_ever_opened") {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let fifo = tmp.path().join("fifo");
        nix::unistd::mkfifo(&fifo, Mode::from_bits_truncate(0o666)).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || {
                let opened = nix::fcntl::open(&fifo, OFlag::O_RDONLY, Mode::empty());
                tx.send(opened.is_ok()).unwrap();
            })
        };
        std::thread::sleep(Duration::from_millis(200));
        let why = message(open_outputs(
            &spec_in(tmp.path(), "fifo"),
            &no_dir(),
            &never,
        ));
        assert!(why.contains("is a named pipe (FIFO)"), "{why}");
        let opened = rx.recv_timeout(Duration::from_millis(500));
        // Let the reader go whatever happened.
        let _writer = nix::fcntl::open(&fifo, OFlag::O_WRONLY | OFlag::O_NONBLOCK, Mode::empty());
        reader.join().unwrap();
        assert!(opened.is_err(), "the FIFO was opened for writing");
    }

    #[test]
    fn regular_files_are_truncated_and_made_private_and_dev_null_is_left_alone() {
        if !as_root("regular_files_are_truncated_and_made_private_and_dev_null_is_left_alone") {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("out");
        std::fs::write(&file, "old output").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let (o, _) = open_outputs(&spec_in(tmp.path(), "out"), &no_dir(), &never).unwrap();
        let meta = std::fs::metadata(&file).unwrap();
        assert_eq!((meta.len(), meta.mode() & 0o777), (0, 0o600));
        let flags = fcntl(o.as_raw_fd(), FcntlArg::F_GETFL).unwrap();
        assert_eq!(
            flags & libc::O_NONBLOCK,
            0,
            "the job's stdout is non-blocking"
        );
        let before = std::fs::metadata("/dev/null").unwrap().mode();
        let mut spec = spec_in(tmp.path(), "x");
        spec.stdout = "/dev/null".into();
        spec.stderr = spec.stdout.clone();
        assert!(open_outputs(&spec, &no_dir(), &never).is_ok());
        assert_eq!(std::fs::metadata("/dev/null").unwrap().mode(), before);
        // Another character device is refused.
        spec.stdout = "/dev/zero".into();
        let why = message(open_outputs(&spec, &no_dir(), &never));
        assert!(
            why.contains("character device other than /dev/null"),
            "{why}"
        );
    }

    #[test]
    fn a_requeued_run_appends_to_the_last_runs_output() {
        if !as_root("a_requeued_run_appends_to_the_last_runs_output") {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("out");
        std::fs::write(&file, "first run\n").unwrap();
        let mut spec = spec_in(tmp.path(), "out");
        spec.append_output = true;
        let (o, _) = open_outputs(&spec, &no_dir(), &never).unwrap();
        let flags = fcntl(o.as_raw_fd(), FcntlArg::F_GETFL).unwrap();
        assert_ne!(flags & libc::O_APPEND, 0, "appending");
        let mut out = std::fs::File::from(o);
        std::io::Write::write_all(&mut out, b"second run\n").unwrap();
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            "first run\nsecond run\n"
        );
    }

    #[test]
    fn a_symlink_is_never_followed() {
        if !as_root("a_symlink_is_never_followed") {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("target");
        std::fs::write(&target, "keep").unwrap();
        std::os::unix::fs::symlink(&target, tmp.path().join("link")).unwrap();
        let why = message(open_outputs(
            &spec_in(tmp.path(), "link"),
            &no_dir(),
            &never,
        ));
        assert!(why.contains("is a symbolic link"), "{why}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
    }

    #[test]
    fn a_leased_file_waits_only_until_stop_is_asked() {
        if !as_root("a_leased_file_waits_only_until_stop_is_asked") {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("leased");
        std::fs::write(&file, "x").unwrap();
        let holder = std::fs::File::open(&file).unwrap();
        // The kernel tells the lease holder (this process) of the break with SIGIO.
        // SAFETY: ignoring a signal.
        unsafe { libc::signal(libc::SIGIO, libc::SIG_IGN) };
        // SAFETY: fcntl on a descriptor we hold.
        let rc = unsafe { libc::fcntl(holder.as_raw_fd(), libc::F_SETLEASE, libc::F_RDLCK) };
        assert_eq!(rc, 0, "F_SETLEASE: {}", std::io::Error::last_os_error());
        let asked = std::cell::Cell::new(0);
        let stop = || {
            asked.set(asked.get() + 1);
            (asked.get() >= 3).then_some(Stop::Cancelled)
        };
        let started = std::time::Instant::now();
        let r = open_outputs(&spec_in(tmp.path(), "leased"), &no_dir(), &stop);
        assert!(matches!(r, Err(Abort::Stop(Stop::Cancelled))));
        assert!(started.elapsed() < Duration::from_secs(5));
        drop(holder);
        // The lease gone, the file opens.
        assert!(open_outputs(&spec_in(tmp.path(), "leased"), &no_dir(), &never).is_ok());
    }

    #[test]
    fn a_captured_stream_goes_to_roots_file_in_the_job_directory_and_not_to_the_users() {
        if !as_root(
            "a_captured_stream_goes_to_roots_file_in_the_job_directory_and_not_to_the_users",
        ) {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let jd = JobDir::new(tmp.path().to_path_buf());
        let mut spec = spec_in(tmp.path(), "user.out");
        spec.capture_stdout = true;
        spec.capture_stderr = true;
        let (o, e) = open_outputs(&spec, &jd, &never).unwrap();
        std::io::Write::write_all(&mut std::fs::File::from(o), b"out\x1b\n").unwrap();
        std::io::Write::write_all(&mut std::fs::File::from(e), b"err\n").unwrap();
        assert_eq!(std::fs::read(jd.captured(false)).unwrap(), b"out\x1b\n");
        assert_eq!(std::fs::read(jd.captured(true)).unwrap(), b"err\n");
        assert!(!tmp.path().join("user.out").exists());
        let mode = std::fs::metadata(jd.captured(false)).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // Only standard output captured: errors go to the user's file.
        spec.capture_stderr = false;
        spec.stderr = tmp.path().join("user.err");
        let (_, e) = open_outputs(&spec, &jd, &never).unwrap();
        std::io::Write::write_all(&mut std::fs::File::from(e), b"mine\n").unwrap();
        assert_eq!(
            std::fs::read(tmp.path().join("user.err")).unwrap(),
            b"mine\n"
        );
    }
}
