//! The job's cgroup, made and filled by the shim (real root). On cgroup v2 it is made before
//! the container's init exists, which is cloned straight into it (`CLONE_INTO_CGROUP`, no
//! migration); on v1, where a move is unavoidable, it is made while the init mounts, and the
//! init is moved in before it runs anything of the job's.
//!
//! v2: one directory `/sys/fs/cgroup/PARENT/JOB/ID`, with the cpu, cpuset, memory and pids
//! controllers enabled above it, and the device filter (an eBPF program, see
//! [`super::devices`]) attached to it. v1: one directory per controller that Wharf sets
//! (memory, cpu, cpuset, pids, devices), the device list written to `devices.deny`/`allow`.
//!
//! `JOB` is the job's cgroup on the node ([`crate::JobCgroupSpec`]), shared by the job's tasks
//! and its steps' tasks, each a leaf under it: it holds no process itself, and its memory,
//! pids and cpuset limits hold for all the leaves together (a step cannot use memory the batch
//! command holds). Each leaf keeps its own task's limits under it. Whichever shim comes first
//! makes it and every shim writes the same limits; the last to leave removes it (a removal
//! while another task is still there fails with EBUSY and leaves it). A spec without a job
//! cgroup (written by an older agent) has its leaf directly under `PARENT`.

use std::fs;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use nix::unistd::Pid;

use super::plan::DeviceRule;
use crate::cgroup_usage::{is_v2, CGROUP_ROOT};
use crate::error::{ErrorKind, RuntimeError};
use crate::spec::ContainerSpec;

/// The v1 controllers Wharf creates a job directory in. The last two only count (CPU time,
/// block I/O for accounting); they are used where mounted, once each when mounted together
/// with another (`cpu,cpuacct`).
pub(crate) const V1_CONTROLLERS: [&str; 7] = [
    "memory", "cpu", "cpuset", "pids", "devices", "cpuacct", "blkio",
];
/// The v2 controllers enabled for job cgroups (those the kernel offers).
const V2_CONTROLLERS: [&str; 5] = ["cpu", "cpuset", "memory", "pids", "io"];
/// CPU bandwidth period, µs.
const CPU_PERIOD_US: u64 = 100_000;

/// A job's cgroup: its directories, and on v2 a descriptor to clone into.
#[derive(Debug)]
pub(crate) struct JobCgroup {
    dirs: Vec<PathBuf>,
    /// The job's cgroup directories above `dirs` (one per hierarchy), removed after them when
    /// no other leaf is left in them.
    jobs: Vec<PathBuf>,
    v2_fd: Option<OwnedFd>,
}

impl JobCgroup {
    /// Creates the job's cgroup with the spec's limits and the device filter `devices`
    /// (everything else denied). A directory left by an earlier, crashed shim of the same job
    /// is reused if it is empty. On failure nothing is left behind.
    pub(crate) fn create(
        spec: &ContainerSpec,
        devices: &[DeviceRule],
    ) -> Result<JobCgroup, RuntimeError> {
        let rel = spec.cgroup_path();
        let rel = rel.trim_start_matches('/');
        let mut attempt = 0;
        loop {
            let mut cg = JobCgroup {
                dirs: Vec::new(),
                jobs: Vec::new(),
                v2_fd: None,
            };
            let made = if is_v2() {
                cg.create_v2(Path::new(CGROUP_ROOT), rel, spec, devices)
            } else {
                cg.create_v1(rel, spec, devices)
            };
            match made {
                Ok(()) => return Ok(cg),
                Err(e) => {
                    cg.remove();
                    // The job's last other task removed the job's cgroup between our mkdir
                    // of it and of our leaf: make it again.
                    attempt += 1;
                    if e.kind != ErrorKind::NotFound || spec.job_cgroup.is_none() || attempt > 2 {
                        return Err(e);
                    }
                }
            }
        }
    }

    /// The v2 cgroup `rel` under the hierarchy mounted at `root` (the node's cgroup root; a
    /// test may name a hybrid host's unified hierarchy).
    fn create_v2(
        &mut self,
        root: &Path,
        rel: &str,
        spec: &ContainerSpec,
        devices: &[DeviceRule],
    ) -> Result<(), RuntimeError> {
        let dir = root.join(rel);
        // Enable the controllers on the way down (the job's own directory is a leaf).
        let mut at = root.to_path_buf();
        for comp in Path::new(rel)
            .parent()
            .into_iter()
            .flat_map(Path::components)
        {
            enable_controllers(&at)?;
            at.push(comp);
            mkdir(&at)?;
        }
        enable_controllers(&at)?;
        if let Some(job) = &spec.job_cgroup {
            // `at` is the job's cgroup, the leaf's parent.
            self.jobs.push(at.clone());
            if let Some(mem) = job.memory {
                write(&at, "memory.max", &mem.to_string())?;
                write_if_present(&at, "memory.swap.max", "0")?;
            }
            if !job.cpuset.is_empty() {
                write(&at, "cpuset.cpus", &cpu_list(&job.cpuset))?;
            }
            if let Some(pids) = job.pids {
                write(&at, "pids.max", &pids.to_string())?;
            }
        }
        make_leaf(&dir)?;
        self.dirs.push(dir.clone());
        if let Some(mem) = spec.memory {
            write(&dir, "memory.max", &mem.to_string())?;
            // A memory limit is a limit on memory, not on memory plus swap.
            write_if_present(&dir, "memory.swap.max", "0")?;
        }
        if let Some(cpus) = spec.cpus {
            let quota = u64::from(cpus) * CPU_PERIOD_US;
            write(&dir, "cpu.max", &format!("{quota} {CPU_PERIOD_US}"))?;
        }
        if !spec.cpuset.is_empty() {
            write(&dir, "cpuset.cpus", &cpu_list(&spec.cpuset))?;
        }
        if let Some(pids) = spec.pids {
            write(&dir, "pids.max", &pids.to_string())?;
        }
        let fd = crate::sys::open_fd(
            &dir,
            nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_RDONLY,
        )
        .map_err(|e| RuntimeError::sys(dir.display(), e))?;
        super::devices::attach_filter(&fd, devices).map_err(|e| {
            RuntimeError::new(ErrorKind::Unavailable, format!("{}: {e}", dir.display()))
        })?;
        self.v2_fd = Some(fd);
        Ok(())
    }

    fn create_v1(
        &mut self,
        rel: &str,
        spec: &ContainerSpec,
        devices: &[DeviceRule],
    ) -> Result<(), RuntimeError> {
        let mut seen = Vec::new();
        for ctl in V1_CONTROLLERS {
            let hierarchy = Path::new(CGROUP_ROOT).join(ctl);
            let counting_only = matches!(ctl, "cpuacct" | "blkio");
            // A hierarchy mounted under two names (`cpu` and `cpuacct` linked to
            // `cpu,cpuacct`) gets one directory.
            let real = fs::canonicalize(&hierarchy).unwrap_or_else(|_| hierarchy.clone());
            if seen.contains(&real) || (counting_only && !hierarchy.is_dir()) {
                continue;
            }
            seen.push(real);
            if !hierarchy.is_dir() {
                // Devices isolate the job and pids find its processes: always needed. The
                // others only when the job has that limit.
                let needed = match ctl {
                    "memory" => spec.memory.is_some(),
                    "cpu" => spec.cpus.is_some(),
                    "cpuset" => !spec.cpuset.is_empty(),
                    _ => true,
                };
                if !needed {
                    continue;
                }
                return Err(RuntimeError::new(
                    ErrorKind::Unavailable,
                    format!(
                        "this node has no {ctl} cgroup at {} (cgroup v1): the job's limits \
                         cannot be applied; mount the {ctl} controller there",
                        hierarchy.display()
                    ),
                ));
            }
            let dir = hierarchy.join(rel);
            make_parents(&hierarchy, rel, ctl == "cpuset")?;
            if let (Some(job), Some(at)) = (&spec.job_cgroup, dir.parent()) {
                self.jobs.push(at.to_path_buf());
                v1_job_limits(ctl, at, job)?;
            }
            make_leaf(&dir)?;
            self.dirs.push(dir.clone());
            match ctl {
                "memory" => {
                    if let Some(mem) = spec.memory {
                        write(&dir, "memory.limit_in_bytes", &mem.to_string())?;
                        write_if_present(&dir, "memory.memsw.limit_in_bytes", &mem.to_string())?;
                    }
                }
                "cpu" => {
                    if let Some(cpus) = spec.cpus {
                        write(&dir, "cpu.cfs_period_us", &CPU_PERIOD_US.to_string())?;
                        let quota = u64::from(cpus) * CPU_PERIOD_US;
                        write(&dir, "cpu.cfs_quota_us", &quota.to_string())?;
                    }
                }
                "cpuset" => {
                    // A new cpuset cgroup has no CPUs or memory nodes until it is given some.
                    if let Some(parent) = dir.parent() {
                        inherit_cpuset(parent, &dir)?;
                    }
                    if !spec.cpuset.is_empty() {
                        write(&dir, "cpuset.cpus", &cpu_list(&spec.cpuset))?;
                    }
                }
                "pids" => {
                    if let Some(pids) = spec.pids {
                        write(&dir, "pids.max", &pids.to_string())?;
                    }
                }
                "devices" => {
                    for (file, line) in v1_device_writes(devices) {
                        write(&dir, file, &line)?;
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// On v2, the descriptor to clone the init into; `None` on v1 (use [`JobCgroup::join`]).
    pub(crate) fn clone_target(&self) -> Option<&OwnedFd> {
        self.v2_fd.as_ref()
    }

    /// Moves `pid` into the job's cgroup (v1: into every controller's directory). Nothing to do
    /// on v2, where the init was cloned into it.
    pub(crate) fn join(&self, pid: Pid) -> Result<(), RuntimeError> {
        if self.v2_fd.is_some() {
            return Ok(());
        }
        let pid = pid.to_string();
        for dir in &self.dirs {
            write(dir, "cgroup.procs", &pid)?;
        }
        Ok(())
    }

    /// Removes the job's directories. They must be empty of processes; what cannot be removed
    /// is left for [`crate::cgroup_usage::cgroup_dirs`] to find. Idempotent.
    pub(crate) fn remove(&mut self) {
        self.v2_fd = None;
        for dir in self.dirs.drain(..).rev() {
            let _ = fs::remove_dir(&dir);
        }
        // EBUSY while another task or step of the job is still there: it removes it.
        for dir in self.jobs.drain(..).rev() {
            let _ = fs::remove_dir(&dir);
        }
    }

    /// Removes whatever cgroup directories of `spec`'s job exist (after a shim was lost); the
    /// job's cgroup too, when no other leaf is left in it.
    pub(crate) fn remove_all(spec: &ContainerSpec) {
        let leaf = crate::cgroup_usage::cgroup_dirs(&spec.cgroup_path());
        let job = spec
            .job_cgroup_path()
            .map(|p| crate::cgroup_usage::cgroup_dirs(&p))
            .unwrap_or_default();
        for dir in leaf.into_iter().chain(job) {
            let _ = fs::remove_dir(dir);
        }
    }
}

/// Writes the job cgroup's limit of v1 controller `ctl` in its directory `at`.
fn v1_job_limits(ctl: &str, at: &Path, job: &crate::JobCgroupSpec) -> Result<(), RuntimeError> {
    match ctl {
        "memory" => {
            if let Some(mem) = job.memory {
                write(at, "memory.limit_in_bytes", &mem.to_string())?;
                write_if_present(at, "memory.memsw.limit_in_bytes", &mem.to_string())?;
            }
        }
        // Its parent's CPUs and memory nodes were given by `make_parents`.
        "cpuset" if !job.cpuset.is_empty() => {
            write(at, "cpuset.cpus", &cpu_list(&job.cpuset))?;
        }
        "pids" => {
            if let Some(pids) = job.pids {
                write(at, "pids.max", &pids.to_string())?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Makes every level above the job's directory `rel` in `hierarchy`; in a v1 cpuset
/// hierarchy each new level gets its parent's CPUs and memory nodes.
fn make_parents(hierarchy: &Path, rel: &str, cpuset: bool) -> Result<(), RuntimeError> {
    let mut at = hierarchy.to_path_buf();
    for comp in Path::new(rel)
        .parent()
        .into_iter()
        .flat_map(Path::components)
    {
        let parent = at.clone();
        at.push(comp);
        mkdir(&at)?;
        if cpuset {
            inherit_cpuset(&parent, &at)?;
        }
    }
    Ok(())
}

/// What is written to a v1 devices cgroup, in order: deny everything, then allow each rule.
fn v1_device_writes(devices: &[DeviceRule]) -> Vec<(&'static str, String)> {
    let allow = devices.iter().map(|r| ("devices.allow", v1_rule(r)));
    [("devices.deny", "a".to_string())]
        .into_iter()
        .chain(allow)
        .collect()
}

/// `devices.allow` line of a rule.
fn v1_rule(rule: &DeviceRule) -> String {
    let minor = rule.minor.map_or("*".to_string(), |m| m.to_string());
    let access = if rule.mknod { "rwm" } else { "rw" };
    format!("c {}:{minor} {access}", rule.major)
}

fn cpu_list(cpus: &[u32]) -> String {
    cpus.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn mkdir(dir: &Path) -> Result<(), RuntimeError> {
    match fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(RuntimeError::io(
            format!("creating cgroup {}", dir.display()),
            e,
        )),
    }
}

/// Creates the job's own directory; one that exists must be empty (a crashed earlier shim's).
fn make_leaf(dir: &Path) -> Result<(), RuntimeError> {
    if fs::create_dir(dir).is_ok() {
        return Ok(());
    }
    let busy = fs::read_to_string(dir.join("cgroup.procs"))
        .map(|t| !t.trim().is_empty())
        .unwrap_or(false);
    if busy {
        return Err(RuntimeError::new(
            ErrorKind::InvalidInput,
            format!(
                "cgroup {} exists and has processes: is this job already running?",
                dir.display()
            ),
        ));
    }
    mkdir(dir)
}

fn write(dir: &Path, file: &str, value: &str) -> Result<(), RuntimeError> {
    let path = dir.join(file);
    fs::write(&path, value)
        .map_err(|e| RuntimeError::io(format!("writing {value:?} to {}", path.display()), e))
}

fn write_if_present(dir: &Path, file: &str, value: &str) -> Result<(), RuntimeError> {
    if dir.join(file).exists() {
        write(dir, file, value)
    } else {
        Ok(())
    }
}

/// Enables in `dir`'s children every job controller the kernel offers there that is not yet
/// enabled.
fn enable_controllers(dir: &Path) -> Result<(), RuntimeError> {
    let read = |f: &str| fs::read_to_string(dir.join(f)).unwrap_or_default();
    let (offered, enabled) = (read("cgroup.controllers"), read("cgroup.subtree_control"));
    let has = |text: &str, c: &str| text.split_whitespace().any(|w| w == c);
    let missing: Vec<String> = V2_CONTROLLERS
        .iter()
        .filter(|c| has(&offered, c) && !has(&enabled, c))
        .map(|c| format!("+{c}"))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    write(dir, "cgroup.subtree_control", &missing.join(" "))
}

/// Gives a v1 cpuset cgroup its parent's CPUs and memory nodes where it has none.
fn inherit_cpuset(parent: &Path, dir: &Path) -> Result<(), RuntimeError> {
    for file in ["cpuset.cpus", "cpuset.mems"] {
        let mine = fs::read_to_string(dir.join(file)).unwrap_or_default();
        if mine.trim().is_empty() {
            let theirs = fs::read_to_string(parent.join(file))
                .map_err(|e| RuntimeError::io(parent.join(file).display(), e))?;
            write(dir, file, theirs.trim())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup` on a v2 host, often
    /// `/sys/fs/cgroup/unified` on a hybrid one), from the mount table.
    #[cfg(feature = "v2-devices")]
    fn cgroup2_mount() -> Option<PathBuf> {
        let table = fs::read_to_string("/proc/self/mountinfo").ok()?;
        table.lines().find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let at = left.split_whitespace().nth(4)?;
            (right.split_whitespace().next() == Some("cgroup2")).then(|| PathBuf::from(at))
        })
    }

    /// The cgroup v2 device filter, attached by the code path v2 nodes run
    /// ([`JobCgroup::create_v2`]), stops every process in the job's cgroup, root's included,
    /// from opening a device the job was not given: EPERM, where without the filter the open
    /// reaches the (absent) driver: ENXIO. On a hybrid host it runs on the unified hierarchy,
    /// whose device programs the kernel consults as on a v2 host.
    #[cfg(feature = "v2-devices")]
    #[test]
    fn v2_device_filter_refuses_an_unallocated_gpu_to_root_in_the_jobs_cgroup() {
        use nix::sys::stat::{makedev, mknod, Mode, SFlag};
        use std::io::Write;
        let test = "v2_device_filter_refuses_an_unallocated_gpu_to_root_in_the_jobs_cgroup";
        let why = match (nix::unistd::geteuid().is_root(), cgroup2_mount()) {
            (false, _) => Some("needs root"),
            (_, None) => Some("no cgroup2 hierarchy is mounted"),
            _ => None,
        };
        if !crate::test_can_run(test, why) {
            return;
        }
        let root = cgroup2_mount().unwrap();
        // Device nodes need a filesystem without nodev.
        let dev = tempfile::Builder::new()
            .prefix("wharf-fakegpu-")
            .tempdir_in("/var/tmp")
            .unwrap();
        let mut spec = crate::conformance::template("devtest", Path::new("/"), 1, 1);
        // No limits: a hybrid host's unified hierarchy has no controllers.
        (spec.memory, spec.cpus, spec.pids) = (None, None, None);
        for minor in 0..2u32 {
            let host = dev.path().join(format!("nvidia{minor}"));
            mknod(
                &host,
                SFlag::S_IFCHR,
                Mode::from_bits_truncate(0o666),
                makedev(195, minor.into()),
            )
            .unwrap();
            if minor == 1 {
                spec.devices = vec![crate::DeviceNode::from_host(&host, "/dev/nvidia1").unwrap()];
            }
        }
        let plan = crate::sandbox::Plan::new(&spec, "/r".into()).unwrap();
        let rel = format!("wharf-devtest-{}/job", std::process::id());
        let mut cg = JobCgroup {
            dirs: Vec::new(),
            jobs: Vec::new(),
            v2_fd: None,
        };
        let made = cg.create_v2(&root, &rel, &spec, &plan.devices);
        let parent = root.join(format!("wharf-devtest-{}", std::process::id()));
        if let Err(e) = made {
            cg.remove();
            let _ = fs::remove_dir(&parent);
            panic!("{test}: {e}");
        }
        // A root helper, moved into the job's cgroup before it opens anything.
        let script = format!(
            "read go; head -c1 {0}/nvidia0 2>&1; head -c1 {0}/nvidia1 2>&1",
            dev.path().display()
        );
        let mut helper = std::process::Command::new("sh")
            .args(["-c", &script])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let moved = fs::write(
            root.join(&rel).join("cgroup.procs"),
            helper.id().to_string(),
        );
        let _ = helper.stdin.take().unwrap().write_all(b"go\n");
        let out = helper.wait_with_output().unwrap();
        cg.remove();
        let _ = fs::remove_dir(&parent);
        moved.unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(
            lines[0].ends_with("Operation not permitted"),
            "unallocated GPU: {text}"
        );
        assert!(
            lines[1].ends_with("No such device or address"),
            "allocated GPU: {text}"
        );
    }

    /// A job's task and a step's task: two leaves under the job's cgroup, which has the job's
    /// limits and goes with the last of them.
    #[test]
    fn leaves_of_one_job_share_its_cgroup_which_goes_with_the_last() {
        let test = "leaves_of_one_job_share_its_cgroup_which_goes_with_the_last";
        let root = nix::unistd::geteuid().is_root();
        if !crate::test_can_run(test, (!root).then_some("needs root")) {
            return;
        }
        let parent = format!("wharf-jobcg-{}", std::process::id());
        let mut task = crate::conformance::template("wharf-7", Path::new("/"), 1, 1);
        task.cgroup_parent = parent.clone();
        (task.memory, task.cpus, task.pids) = (Some(64 << 20), None, Some(100));
        task.job_cgroup = Some(crate::JobCgroupSpec {
            name: "wharf-7".into(),
            memory: Some(96 << 20),
            cpuset: vec![],
            pids: Some(200),
        });
        let mut step = task.clone();
        step.id = "wharf-7.s0.0".into();
        let job = task.job_cgroup_path().unwrap();
        assert_eq!(job, format!("/{parent}/wharf-7"));
        assert_eq!(step.cgroup_path(), format!("{job}/wharf-7.s0.0"));
        let limit = |path: &str| -> Option<String> {
            let file = if is_v2() {
                "memory.max"
            } else {
                "memory.limit_in_bytes"
            };
            crate::cgroup_usage::cgroup_dirs(path)
                .iter()
                .find_map(|d| fs::read_to_string(d.join(file)).ok())
                .map(|t| t.trim().to_string())
        };
        let made =
            JobCgroup::create(&task, &[]).and_then(|a| Ok((a, JobCgroup::create(&step, &[])?)));
        let checked = made.map(|(mut a, mut b)| {
            let limits = (
                limit(&job),
                limit(&task.cgroup_path()),
                limit(&step.cgroup_path()),
            );
            a.remove();
            let after_one = (
                crate::cgroup_usage::cgroup_dirs(&task.cgroup_path()).is_empty(),
                crate::cgroup_usage::cgroup_dirs(&job).is_empty(),
            );
            b.remove();
            (
                limits,
                after_one,
                crate::cgroup_usage::cgroup_dirs(&job).is_empty(),
            )
        });
        for d in crate::cgroup_usage::cgroup_dirs(&format!("/{parent}")) {
            let _ = fs::remove_dir(d);
        }
        let (limits, after_one, after_both) = checked.unwrap();
        let (job_mem, task_mem) = ((96u64 << 20).to_string(), (64u64 << 20).to_string());
        assert_eq!(
            limits,
            (Some(job_mem), Some(task_mem.clone()), Some(task_mem)),
            "the job's limit above, each task's own in its leaf"
        );
        assert_eq!(
            after_one,
            (true, false),
            "the job's cgroup stays for the step"
        );
        assert!(after_both, "the last leaf takes the job's cgroup with it");
    }

    #[test]
    fn v1_rules_name_the_device_and_never_give_mknod_for_job_devices() {
        let gpu = DeviceRule {
            major: 195,
            minor: Some(3),
            mknod: false,
        };
        assert_eq!(v1_rule(&gpu), "c 195:3 rw");
        let pts = DeviceRule {
            major: 136,
            minor: None,
            mknod: true,
        };
        assert_eq!(v1_rule(&pts), "c 136:* rwm");
        // Everything is denied before anything is allowed.
        let writes = v1_device_writes(&[pts, gpu]);
        let lines: Vec<(&str, &str)> = writes.iter().map(|(f, l)| (*f, l.as_str())).collect();
        assert_eq!(
            lines,
            [
                ("devices.deny", "a"),
                ("devices.allow", "c 136:* rwm"),
                ("devices.allow", "c 195:3 rw")
            ]
        );
        assert_eq!(cpu_list(&[0, 2, 5]), "0,2,5");
    }
}
