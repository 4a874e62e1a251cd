//! What a job's sandbox is made of, computed from its [`ContainerSpec`]. Pure: the result
//! depends only on the input, so the whole layout is unit-tested without a kernel.
//!
//! The layout is runc's default one, adapted to a user namespace with the host network: no
//! `gid=`/`uid=` mount options (those ids are unmapped), the host's `/sys` bound read-only (a
//! fresh sysfs needs a network namespace of its own), the standard devices bound from the host
//! (mknod is impossible in a user namespace), a private `/tmp` and a sized `/dev/shm`.

use std::path::PathBuf;

use nix::mount::MsFlags;

use crate::error::{ErrorKind, RuntimeError};
use crate::spec::ContainerSpec;
use crate::sys::{ATTR_NODEV, ATTR_NOEXEC, ATTR_NOSUID, ATTR_RDONLY};

/// Character devices every container may use (runc's default allow list): null, zero, full,
/// random, urandom, tty, ptmx and the pts devices (`None` = any minor).
pub(crate) const STANDARD_DEVICES: [(i64, Option<i64>); 8] = [
    (1, Some(3)),
    (1, Some(5)),
    (1, Some(7)),
    (1, Some(8)),
    (1, Some(9)),
    (5, Some(0)),
    (5, Some(2)),
    (136, None),
];

/// The standard device nodes bound from the host into the sandbox's `/dev`.
const STANDARD_NODES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

/// Paths hidden from the job (runc's defaults): a file gets `/dev/null` over it, a directory an
/// empty read-only tmpfs.
pub(crate) const MASKED_PATHS: [&str; 11] = [
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];

/// Paths the job may read but never change (runc's defaults).
pub(crate) const READONLY_PATHS: [&str; 5] = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// `/dev` symlinks every Linux program expects.
pub(crate) const DEV_SYMLINKS: [(&str, &str); 5] = [
    ("/proc/self/fd", "/dev/fd"),
    ("/proc/self/fd/0", "/dev/stdin"),
    ("/proc/self/fd/1", "/dev/stdout"),
    ("/proc/self/fd/2", "/dev/stderr"),
    ("pts/ptmx", "/dev/ptmx"),
];

/// What is mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Source {
    /// A new filesystem of this type (`proc`, `tmpfs`, `devpts`), with these `mount(2)` flags
    /// and data.
    Fs {
        fstype: &'static str,
        flags: MsFlags,
        data: String,
    },
    /// A bind of this host path (recursive when it is a directory), then `attrs` set on every
    /// mount of it.
    Bind { host: PathBuf, attrs: u64 },
    /// A user's bind: the mount tree the shim cloned from the source it opened as the user
    /// (for the spec's `binds[bind]`, see `as_user.rs`), then `attrs` set on every mount of it.
    Opened { bind: usize, attrs: u64 },
    /// Not a mount: a fresh file the sandbox writes with these contents in its own `/tmp`
    /// (a spec's `tmp_files`), owned by the container's root and left read-only (0444).
    Written { contents: String },
}

/// What must exist at a mount's target before mounting. The sandbox creates targets only
/// inside its own `/dev`, where no bind may land ([`RESERVED`]); everywhere else they must
/// exist (the shim made them in the job's layer, before any bind): nothing is ever created
/// in a bound host directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// Already there (a directory or file of the root).
    Existing,
    /// A directory, made if missing (with its parents).
    Dir,
    /// An empty file, made if missing (with its parents): a device node's mount point.
    File,
    /// A bind's mount point: already there, like [`Target::Existing`], and checked where it
    /// resolves to: never at or under what the sandbox makes ([`RESERVED`]), whatever the
    /// path's text says (a symlink in the image, the host's root or an outer bind could aim
    /// it there). A user's is also reached through no symlink at all (`symlinks: false`); the
    /// node's own binds (site paths, CDI driver files, which real driver installs reach
    /// through symlinks such as `/lib64`) may pass through symlinks inside the root.
    Bind { symlinks: bool },
}

/// One mount, at a path inside the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mount {
    /// Absolute path inside the container.
    pub path: String,
    /// What goes there.
    pub source: Source,
    /// What must be there first.
    pub target: Target,
}

/// One device-cgroup allow rule: character device `major:minor` (`None` = any minor).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DeviceRule {
    pub major: i64,
    pub minor: Option<i64>,
    /// Also allows creating the node (never for the job's own devices).
    pub mknod: bool,
}

impl DeviceRule {
    /// The rules for [`STANDARD_DEVICES`], which every job may use and make nodes of.
    pub(crate) fn standard() -> Vec<DeviceRule> {
        STANDARD_DEVICES
            .iter()
            .map(|&(major, minor)| DeviceRule {
                major,
                minor,
                mknod: true,
            })
            .collect()
    }
}

/// What the job may do beyond its ids: the capabilities it keeps (in every set: bounding,
/// permitted, effective, inheritable, ambient) and whether it may ever gain more (a setuid
/// file, file capabilities). Every job keeps none and gains none, root inside included.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Privileges {
    pub capabilities: Vec<caps::Capability>,
    pub no_new_privs: bool,
}

/// The whole sandbox, in the order it is built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The prepared root (an overlay or the bound host root).
    pub root: PathBuf,
    /// Mounts, in order: later ones may sit on earlier ones.
    pub mounts: Vec<Mount>,
    /// The device cgroup: everything denied except these.
    pub devices: Vec<DeviceRule>,
    /// Capabilities and no_new_privs, applied when the init takes the job's ids.
    pub privileges: Privileges,
    /// Hostname inside.
    pub hostname: String,
    /// Ids inside the container: user, group, supplementary groups.
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    /// The program, its arguments and environment.
    pub argv: Vec<String>,
    pub env: Vec<String>,
    /// Working directory inside.
    pub cwd: String,
    /// Run no program: the init's child ends with 0 where it would exec it
    /// ([`crate::ContainerSpec::idle`]), or waits there to be stopped
    /// ([`crate::ContainerSpec::hold`]).
    pub idle: bool,
    /// With `idle`: wait to be stopped.
    pub hold: bool,
}

/// What the sandbox makes itself: no bind may land at or under one of these (or at `/`). A
/// bind there would hide them or, worse, have the init make its mount points and `/dev`
/// symlinks inside the bound host directory. `/tmp` is a tmpfs in which nothing is made, so a
/// bind may replace it. The same rule refuses such a `--mount` at submit
/// (`wharf_api::job::reserved_destination`).
pub const RESERVED: [&str; 3] = ["/proc", "/sys", "/dev"];

/// The reserved directory (or `/`) that `destination` lands at or under.
pub(crate) fn reserved(destination: &str) -> Option<&'static str> {
    let mut parts = destination
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".");
    match parts.next() {
        None => Some("/"),
        Some(top) => RESERVED
            .into_iter()
            .find(|r| r.trim_start_matches('/') == top),
    }
}

/// Refuses a bind at or under what the sandbox makes itself ([`RESERVED`]), or at `/`, and a
/// `tmp_files` name that is not one plain path component.
pub(crate) fn check_destinations(spec: &ContainerSpec) -> Result<(), RuntimeError> {
    for (name, _) in &spec.tmp_files {
        if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
            return Err(RuntimeError::new(
                ErrorKind::InvalidInput,
                format!(
                    "file {name:?} for {}: a name of one path component is needed",
                    crate::TMP_FILES_DIR
                ),
            ));
        }
    }
    for b in &spec.binds {
        if let Some(dir) = reserved(&b.destination) {
            return Err(RuntimeError::new(
                ErrorKind::InvalidInput,
                format!(
                    "mount {}:{}: the sandbox makes {dir} itself; no bind may land at or under \
                     it (choose another destination)",
                    b.source.display(),
                    b.destination
                ),
            ));
        }
    }
    Ok(())
}

/// For the Docker engine: refuses a bind whose destination lies inside another bind's when
/// either is the user's. The engine makes a missing mount point itself, as root, and inside a
/// bind that is the bound host directory: the user's own, or a shared one that holds theirs
/// (a home under `/home`). Two of the node's own binds nest as the admin set them. Wharf's
/// own sandbox makes mount points in the job's layer only, and a nested one must already
/// exist there.
pub(crate) fn check_not_nested(spec: &ContainerSpec) -> Result<(), RuntimeError> {
    let parts = |p: &str| -> Vec<String> {
        p.split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .map(str::to_string)
            .collect()
    };
    for outer in &spec.binds {
        let top = parts(&outer.destination);
        for inner in &spec.binds {
            let under = parts(&inner.destination);
            let users = outer.beneath.is_some() || inner.beneath.is_some();
            if users && under.len() > top.len() && under.starts_with(&top) {
                return Err(RuntimeError::new(
                    ErrorKind::InvalidInput,
                    format!(
                        "mount {}:{} lies inside the bind at {}: the Docker engine would make \
                         its mount point in {} itself; mount it beside it instead",
                        inner.source.display(),
                        inner.destination,
                        outer.destination,
                        outer.source.display()
                    ),
                ));
            }
        }
    }
    Ok(())
}

impl Plan {
    /// The sandbox for `spec`, whose root has been prepared at `root`. Refuses a bind at or
    /// under what the sandbox makes itself ([`RESERVED`]).
    pub(crate) fn new(spec: &ContainerSpec, root: PathBuf) -> Result<Plan, RuntimeError> {
        check_destinations(spec)?;
        let mut devices = DeviceRule::standard();
        // Each allocated device by its own number: read and write, never mknod.
        devices.extend(spec.devices.iter().map(|d| DeviceRule {
            major: d.major,
            minor: Some(d.minor),
            mknod: false,
        }));
        let (uid, gid) = if spec.remap_root {
            (0, 0)
        } else {
            (spec.uid, spec.gid)
        };
        let mut groups: Vec<u32> = spec
            .groups
            .iter()
            .copied()
            .filter(|&g| g != spec.gid)
            .collect();
        groups.sort_unstable();
        groups.dedup();
        Ok(Plan {
            root,
            mounts: mounts(spec),
            devices,
            privileges: Privileges {
                capabilities: Vec::new(),
                no_new_privs: true,
            },
            hostname: spec.hostname.clone(),
            uid,
            gid,
            groups,
            argv: spec.argv.clone(),
            env: spec.env.clone(),
            cwd: spec.cwd.clone(),
            idle: spec.idle,
            hold: spec.idle && spec.hold,
        })
    }
}

fn fs(path: &str, fstype: &'static str, flags: MsFlags, data: String, target: Target) -> Mount {
    Mount {
        path: path.into(),
        source: Source::Fs {
            fstype,
            flags,
            data,
        },
        target,
    }
}

fn bind(path: &str, host: impl Into<PathBuf>, attrs: u64, target: Target) -> Mount {
    Mount {
        path: path.into(),
        source: Source::Bind {
            host: host.into(),
            attrs,
        },
        target,
    }
}

fn mounts(spec: &ContainerSpec) -> Vec<Mount> {
    let nosuid = MsFlags::MS_NOSUID;
    let (noexec, nodev) = (MsFlags::MS_NOEXEC, MsFlags::MS_NODEV);
    let mut list = vec![
        fs(
            "/proc",
            "proc",
            nosuid | noexec | nodev,
            String::new(),
            Target::Existing,
        ),
        fs(
            "/dev",
            "tmpfs",
            nosuid | MsFlags::MS_STRICTATIME,
            "mode=755,size=65536k".into(),
            Target::Existing,
        ),
        fs(
            "/dev/pts",
            "devpts",
            nosuid | noexec,
            "newinstance,ptmxmode=0666,mode=0620".into(),
            Target::Dir,
        ),
        fs(
            "/dev/shm",
            "tmpfs",
            nosuid | noexec | nodev,
            format!("mode=1777,size={}", spec.shm_size),
            Target::Dir,
        ),
    ];
    // A device node is neither run nor setuid: its bind needs no attributes (one call fewer).
    for name in STANDARD_NODES {
        let path = format!("/dev/{name}");
        list.push(bind(&path, &path, 0, Target::File));
    }
    list.push(bind(
        "/sys",
        "/sys",
        ATTR_RDONLY | ATTR_NOSUID | ATTR_NOEXEC | ATTR_NODEV,
        Target::Existing,
    ));
    list.push(fs(
        "/tmp",
        "tmpfs",
        nosuid | nodev,
        format!("mode=1777,size={}", spec.tmp_size),
        Target::Existing,
    ));
    // Made in the sandbox's own /tmp before any bind, which may replace /tmp (and then hides
    // them) but never receives them.
    for (name, contents) in &spec.tmp_files {
        list.push(Mount {
            path: format!("{}/{name}", crate::TMP_FILES_DIR),
            source: Source::Written {
                contents: contents.clone(),
            },
            target: Target::File,
        });
    }
    for (i, b) in spec.binds.iter().enumerate() {
        let attrs = ATTR_NOSUID | ATTR_NODEV | if b.read_only { ATTR_RDONLY } else { 0 };
        let source = match b.beneath {
            Some(_) => Source::Opened { bind: i, attrs },
            None => Source::Bind {
                host: b.source.clone(),
                attrs,
            },
        };
        list.push(Mount {
            path: b.destination.clone(),
            source,
            target: Target::Bind {
                symlinks: b.beneath.is_none(),
            },
        });
    }
    // Device nodes are bound one by one (mknod is impossible in a user namespace).
    for d in &spec.devices {
        list.push(bind(&d.path, &d.host_path, 0, Target::File));
    }
    list
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn sample() -> ContainerSpec {
        let mut s = crate::conformance::template("wharf-1", Path::new("/images/x"), 1000, 1000);
        s.argv = vec!["/bin/true".into()];
        s.groups = vec![1000, 27];
        s.hostname = "n1".into();
        s.memory = Some(1 << 30);
        s.cpus = Some(2);
        s.cpuset = vec![0, 1];
        s.cgroup_parent = "wharf".into();
        s.tmp_files = vec![("hostfile".into(), "n1 slots=1\n".into())];
        s.binds = vec![
            crate::Bind {
                source: "/data".into(),
                destination: "/data".into(),
                read_only: true,
                beneath: None,
            },
            crate::Bind {
                source: "/scratch/alice/in".into(),
                destination: "/in".into(),
                read_only: false,
                beneath: Some("/scratch".into()),
            },
        ];
        s.devices = vec![crate::DeviceNode {
            host_path: "/fake/nvidia3".into(),
            path: "/dev/nvidia3".into(),
            major: 195,
            minor: 3,
        }];
        s
    }

    fn find<'a>(p: &'a Plan, path: &str) -> &'a Mount {
        p.mounts.iter().find(|m| m.path == path).unwrap()
    }

    #[test]
    fn sandbox_is_locked_down() {
        let p = Plan::new(&sample(), "/jobs/1/rootfs".into()).unwrap();
        assert_eq!((p.uid, p.gid, p.groups.as_slice()), (1000, 1000, &[27][..]));
        // The job's GPU: read and write by its own number, never mknod; bound, not made.
        assert_eq!(
            p.devices.last(),
            Some(&DeviceRule {
                major: 195,
                minor: Some(3),
                mknod: false
            })
        );
        assert_eq!(p.devices.len(), STANDARD_DEVICES.len() + 1);
        let gpu = find(&p, "/dev/nvidia3");
        assert_eq!(
            gpu.source,
            Source::Bind {
                host: "/fake/nvidia3".into(),
                attrs: 0
            }
        );
        // The host's /sys is read-only, nosuid, noexec and nodev all the way down.
        let Source::Bind { attrs, .. } = &find(&p, "/sys").source else {
            panic!("/sys is not a bind")
        };
        assert_eq!(*attrs, ATTR_RDONLY | ATTR_NOSUID | ATTR_NOEXEC | ATTR_NODEV);
        // Shared paths are nosuid and nodev, read-only when asked.
        let Source::Bind { attrs, .. } = &find(&p, "/data").source else {
            panic!("/data is not a bind")
        };
        assert_eq!(*attrs, ATTR_RDONLY | ATTR_NOSUID | ATTR_NODEV);
        // A user's bind is the tree the shim opened as the user, never a path.
        assert_eq!(
            find(&p, "/in").source,
            Source::Opened {
                bind: 1,
                attrs: ATTR_NOSUID | ATTR_NODEV
            }
        );
        // No mount option names an id (they are unmapped in the user namespace).
        for m in &p.mounts {
            if let Source::Fs { data, flags, .. } = &m.source {
                assert!(!data.contains("gid=") && !data.contains("uid="), "{m:?}");
                assert!(flags.contains(MsFlags::MS_NOSUID), "{m:?}");
            }
        }
        // /dev comes before everything mounted inside it; /tmp before the binds.
        let at = |path: &str| p.mounts.iter().position(|m| m.path == path).unwrap();
        assert!(at("/dev") < at("/dev/pts") && at("/dev") < at("/dev/nvidia3"));
        assert!(at("/tmp") < at("/data"));
    }

    #[test]
    fn nothing_is_made_where_a_bind_may_land() {
        // Every mount point the sandbox creates is in its own /dev ...
        let p = Plan::new(&sample(), "/r".into()).unwrap();
        for m in p.mounts.iter() {
            match m.target {
                // ... but for the files it writes in its own /tmp, before any bind.
                Target::File if matches!(m.source, Source::Written { .. }) => {
                    let first_bind = p
                        .mounts
                        .iter()
                        .position(|x| matches!(x.target, Target::Bind { .. }))
                        .unwrap();
                    let at = p.mounts.iter().position(|x| x == m).unwrap();
                    let tmp = p.mounts.iter().position(|x| x.path == "/tmp").unwrap();
                    assert!(tmp < at && at < first_bind, "{m:?}");
                    assert_eq!(m.path, "/tmp/wharf/hostfile");
                }
                Target::Dir | Target::File => assert_eq!(reserved(&m.path), Some("/dev"), "{m:?}"),
                Target::Existing => {
                    assert!(matches!(m.source, Source::Fs { .. }) || m.path == "/sys")
                }
                Target::Bind { symlinks } => {
                    // Every bind of the spec, checked where it lands; a user's through no symlink.
                    let b = p.mounts.iter().position(|x| x == m).unwrap();
                    assert!(b > 0 && reserved(&m.path).is_none(), "{m:?}");
                    assert_eq!(symlinks, matches!(m.source, Source::Bind { .. }), "{m:?}");
                }
            }
        }
        let binds = p
            .mounts
            .iter()
            .filter(|m| matches!(m.target, Target::Bind { .. }));
        assert_eq!(binds.count(), sample().binds.len());
        for (_, link) in DEV_SYMLINKS {
            assert_eq!(reserved(link), Some("/dev"));
        }
        // ... and no bind may land there, nor on anything else the sandbox makes.
        for dest in [
            "/dev",
            "/dev/x",
            "//dev/shm",
            "/proc",
            "/proc/1",
            "/sys/fs",
            "/",
            "/.",
        ] {
            let mut s = sample();
            s.binds[1].destination = dest.into();
            let e = Plan::new(&s, "/r".into()).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidInput, "{dest}");
            assert!(e.message.contains("no bind may land"), "{dest}: {e}");
        }
        for dest in ["/tmp", "/tmp/x", "/devel", "/mnt/dev"] {
            let mut s = sample();
            s.binds[1].destination = dest.into();
            assert!(Plan::new(&s, "/r".into()).is_ok(), "{dest}");
        }
    }

    #[test]
    fn a_tmp_file_is_named_by_one_plain_component() {
        for name in ["", ".", "..", "a/b", "/x", "a\0b"] {
            let mut s = sample();
            s.tmp_files = vec![(name.into(), "x".into())];
            let e = Plan::new(&s, "/r".into()).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidInput, "{name:?}");
            assert!(e.message.contains("one path component"), "{name:?}: {e}");
        }
    }

    #[test]
    fn the_engine_gets_no_bind_inside_another() {
        let mut s = sample();
        assert!(check_not_nested(&s).is_ok());
        for dest in ["/data/x", "//data/./x/y"] {
            s.binds[1].destination = dest.into();
            let e = check_not_nested(&s).unwrap_err();
            assert!(e.message.contains("lies inside the bind at /data"), "{e}");
        }
        for dest in ["/data", "/database", "/in"] {
            s.binds[1].destination = dest.into();
            assert!(check_not_nested(&s).is_ok(), "{dest}");
        }
        // The user's bind holding one of the node's.
        s.binds[1].destination = "/in".into();
        s.binds[0].destination = "/in/shared".into();
        assert!(check_not_nested(&s).is_err());
        // The node's own binds nest as the admin set them.
        s.binds[1].beneath = None;
        assert!(check_not_nested(&s).is_ok());
    }

    #[test]
    fn no_job_keeps_a_capability_gains_privilege_or_reaches_another_device() {
        let standard = DeviceRule::standard();
        for (remap_root, writable, image) in [
            (false, false, "/images/x"),
            (true, true, "/images/x"),
            (false, false, "/"),
        ] {
            let mut s = sample();
            (s.remap_root, s.writable, s.rootfs) = (remap_root, writable, image.into());
            let p = Plan::new(&s, "/r".into()).unwrap();
            let what = format!("remap_root={remap_root} writable={writable} image={image}");
            assert!(p.privileges.capabilities.is_empty(), "{what}");
            assert!(p.privileges.no_new_privs, "{what}");
            // Deny-all, then exactly the standard list and the job's own GPU (rw, no mknod).
            let mut expected = standard.clone();
            expected.push(DeviceRule {
                major: 195,
                minor: Some(3),
                mknod: false,
            });
            assert_eq!(p.devices, expected, "{what}");
        }
        let mut s = sample();
        s.devices.clear();
        assert_eq!(Plan::new(&s, "/r".into()).unwrap().devices, standard);
    }

    #[test]
    fn remapped_root_is_root_inside() {
        let mut s = sample();
        s.remap_root = true;
        let p = Plan::new(&s, "/r".into()).unwrap();
        assert_eq!((p.uid, p.gid), (0, 0));
    }
}
