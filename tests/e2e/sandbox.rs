//! A job runs as the submitting user, with no privilege, in its own view of the machine.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::Duration;

use crate::harness::*;

#[test]
fn job_runs_as_the_submitting_user_with_no_privilege() {
    if !can_run("job_runs_as_the_submitting_user_with_no_privilege") {
        return;
    }
    let c = Cluster::start();
    c.import_tiny();
    let alice = user("wharf-alice");
    let script = "id -u; id -g; grep CapEff /proc/self/status; \
        mount -t tmpfs x /tmp 2>/dev/null && echo mount-allowed || echo mount-refused; \
        touch /tmp/f; chown 0 /tmp/f 2>/dev/null && echo chown-allowed || echo chown-refused; \
        touch /etc/x 2>/dev/null && echo root-writable || echo root-read-only; \
        echo procs $(ls /proc | grep -c '^[0-9]')";
    // An output file named, so that it is kept once passed on.
    let out = c.run_sh(&alice, &["--image", "tiny", "-o", "kept-%j.out"], script);
    let text = stdout(&out);
    assert!(out.status.success(), "run failed: {text}{}", stderr(&out));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], alice.uid.to_string(), "{text}");
    assert_eq!(lines[1], alice.gid.to_string(), "{text}");
    assert_eq!(lines[2], "CapEff:\t0000000000000000", "{text}");
    assert_eq!(lines[3], "mount-refused");
    assert_eq!(lines[4], "chown-refused");
    assert_eq!(lines[5], "root-read-only");
    // Only the job's own processes (sh, ls, grep and the subshell) and Wharf's init are
    // visible.
    let procs: u32 = lines[6].trim_start_matches("procs ").parse().unwrap();
    assert!(procs <= 5, "job sees {procs} processes: {text}");

    // Its output file belongs to the user and is private.
    let home = c.home(&alice);
    let out_file = std::fs::read_dir(&home)
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().ends_with(".out"))
        .unwrap();
    let meta = out_file.metadata().unwrap();
    assert_eq!((meta.uid(), meta.gid()), (alice.uid, alice.gid));
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
}

#[test]
fn host_image_runs_in_the_same_sandbox() {
    if !can_run("host_image_runs_in_the_same_sandbox") {
        return;
    }
    let c = Cluster::start();
    let alice = user("wharf-alice");
    let script = "id -u; cat /proc/1/comm; cat /proc/2/cmdline | tr '\\0' ' '; echo; \
        touch /usr/x 2>/dev/null && echo rw || echo ro; ls /proc | grep -c '^[0-9]'";
    let out = c.run_sh(&alice, &["--image", "host"], script);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}{}", stderr(&out));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], alice.uid.to_string());
    assert_eq!(lines[1], "wharf-init", "pid 1 is Wharf's init: {text}");
    assert!(
        lines[2].starts_with("/bin/sh -c"),
        "pid 2 is the job: {text}"
    );
    assert_eq!(lines[3], "ro");
    assert!(lines[4].parse::<u32>().unwrap() <= 6, "{text}");
}

#[test]
fn run_exits_with_the_jobs_status() {
    if !can_run("run_exits_with_the_jobs_status") {
        return;
    }
    let c = Cluster::start();
    let alice = user("wharf-alice");
    let out = c.run_sh(&alice, &[], "echo out; echo err >&2; exit 7");
    assert_eq!(out.status.code(), Some(7));
    // Each stream where srun puts it.
    assert_eq!(stdout(&out), "out\n");
    assert!(stderr(&out).contains("\nerr\n"), "{}", stderr(&out));
    assert!(stderr(&out).contains("FAILED"), "{}", stderr(&out));
    // A program that does not exist in the image fails the job, with the reason shown.
    let out = c.wharf_as(&alice, &["run", "--", "/no/such/program"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr(&out).contains("FAILED"), "{}", stderr(&out));
    let out = c.wharf_as(&alice, &["run", "--", "no-such-program"]);
    assert!(
        stderr(&out).contains("command not found in the image: no-such-program"),
        "{}",
        stderr(&out)
    );
    // A bare name is looked up in the job's PATH, not the agent's.
    let out = c.wharf_as(&alice, &["run", "--", "true"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("standard input"), "{}", stderr(&out));
    // Input piped in is not the job's: said, not dropped in silence.
    let mut piped = setpriv(&alice)
        .arg(wharf_bin())
        .args(["run", "--", "true"])
        .current_dir(c.home(&alice))
        .env("WHARF_SOCKET", &c.socket)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    piped.stdin.take().unwrap().write_all(b"a\nb\n").unwrap();
    let out = piped.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("4 bytes given on standard input were not read"),
        "{}",
        stderr(&out)
    );
    // A file named after the job's node (`%N`) is followed once the node is known, even
    // when the job waited past the first answer without one.
    let out = c.run_sh(
        &alice,
        &["--begin", "now+3s", "-o", "run-%N.out"],
        "echo late",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "late\n", "{}", stderr(&out));
}

#[test]
fn kernel_interfaces_are_masked_or_read_only_and_dev_is_minimal() {
    if !can_run("kernel_interfaces_are_masked_or_read_only_and_dev_is_minimal") {
        return;
    }
    let c = Cluster::start();
    c.import_tiny();
    let alice = user("wharf-alice");
    // The options of the topmost mount at a path (mountinfo's sixth field).
    let script = "opts() { o=; while read -r a b c d mp mo rest; do \
        [ \"$mp\" = \"$1\" ] && o=$mo; done < /proc/self/mountinfo; echo \"$o\"; }; \
        for f in /proc/kcore /proc/keys /proc/timer_list /proc/latency_stats /proc/timer_stats \
            /proc/sched_debug; do [ -e $f ] && echo masked $f $(wc -c < $f); done; \
        for d in /proc/acpi /proc/scsi /sys/firmware; do [ -d $d ] && echo masked $d $(ls $d | wc -l); done; \
        for p in /sys /proc/sys /proc/bus /proc/fs /proc/irq /proc/sysrq-trigger; do \
            [ -e $p ] && echo mounted $p $(opts $p); done; \
        echo dev $(ls /dev); \
        echo null $(echo x > /dev/null && echo ok); \
        read -r pid comm state ppid pgrp sid rest < /proc/self/stat; echo session $pid $sid; \
        grep -E '^Sig(Ign|Blk)' /proc/self/status";
    let out = c.run_sh(&alice, &["--image", "tiny"], script);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}{}", stderr(&out));
    let line = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in {text}"))
            .trim()
            .to_string()
    };
    // runc's masked paths that this kernel has are empty in the job, its read-only paths
    // read-only (each as the node has them: kernels differ).
    let on_host = |list: &[&str]| {
        list.iter()
            .filter(|p| std::path::Path::new(p).exists())
            .count()
    };
    let masked: Vec<&str> = text.lines().filter(|l| l.starts_with("masked ")).collect();
    let expected = on_host(&[
        "/proc/kcore",
        "/proc/keys",
        "/proc/timer_list",
        "/proc/latency_stats",
        "/proc/timer_stats",
        "/proc/sched_debug",
        "/proc/acpi",
        "/proc/scsi",
        "/sys/firmware",
    ]);
    assert!(expected > 0, "this node has none of the masked paths");
    assert_eq!(masked.len(), expected, "{text}");
    assert!(masked.iter().all(|l| l.ends_with(" 0")), "{text}");
    let mounted: Vec<&str> = text.lines().filter(|l| l.starts_with("mounted ")).collect();
    assert_eq!(
        mounted.len(),
        on_host(&[
            "/sys",
            "/proc/sys",
            "/proc/bus",
            "/proc/fs",
            "/proc/irq",
            "/proc/sysrq-trigger"
        ]),
        "{text}"
    );
    for l in &mounted {
        let opts = l.rsplit(' ').next().unwrap_or("");
        assert!(opts.split(',').any(|o| o == "ro"), "{l}: {text}");
    }
    assert_eq!(
        line("dev "),
        "fd full null ptmx pts random shm stderr stdin stdout tty urandom zero",
        "{text}"
    );
    assert_eq!(line("null "), "ok", "{text}");
    // The job leads a session of its own, as pid 2 of its pid namespace (Wharf's init is 1).
    assert_eq!(line("session "), "2 2", "{text}");
    // Nothing the supervisor ignores or blocks reaches the job.
    assert_eq!(line("SigIgn:"), "0000000000000000", "{text}");
    assert_eq!(line("SigBlk:"), "0000000000000000", "{text}");
}

#[test]
fn memlock_is_raised_or_clamped_to_what_the_node_can_give() {
    if !can_run("memlock_is_raised_or_clamped_to_what_the_node_can_give") {
        return;
    }
    let c = Cluster::start();
    let alice = user("wharf-alice");
    let out = c.run_sh(&alice, &[], "ulimit -l; echo $WHARF_MEMLOCK");
    let (_, hard) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_MEMLOCK).unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let (ulimit, told) = text.trim().split_once('\n').expect("two lines");
    // The job has the limit it is told it has.
    if told == "unlimited" {
        assert_eq!(ulimit, "unlimited", "{text}");
    } else {
        assert_eq!(
            ulimit,
            (told.parse::<u64>().unwrap() / 1024).to_string(),
            "{text}"
        );
    }
    // The agent runs with this test's limits: unlimited if it may raise them, else its hard
    // limit, on cgroup v1 and v2 hosts alike (loading a v2 device filter changes no limit).
    let expected = if caps_has_sys_resource() || hard == libc::RLIM_INFINITY {
        "unlimited".to_string()
    } else {
        hard.to_string()
    };
    assert_eq!(told, expected, "{text}");
}

fn caps_has_sys_resource() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .unwrap()
        .trim();
    const CAP_SYS_RESOURCE: u32 = 24;
    u64::from_str_radix(eff, 16).unwrap() & (1 << CAP_SYS_RESOURCE) != 0
}

#[test]
fn image_jobs_get_shared_paths_their_workdir_and_their_user_entry() {
    if !can_run("image_jobs_get_shared_paths_their_workdir_and_their_user_entry") {
        return;
    }
    // A directory plays the site's shared storage, bound read-write at its own path and
    // read-only at /data.
    let shared = scratch("wharf-shared-");
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let c = Cluster::start_with(&format!(
        "mounts = [\"{0}\", \"{0}:/data:ro\"]",
        shared.path().display()
    ));
    c.import_tiny();
    let alice = user("wharf-alice");
    let work = shared.path().join("project");
    std::fs::create_dir_all(&work).unwrap();
    nix::unistd::chown(&work, Some(alice.uid.into()), Some(alice.gid.into())).unwrap();
    std::fs::write(work.join("input.txt"), "data from the shared disk\n").unwrap();
    let script = "pwd; cat input.txt; echo result > output.txt && echo wrote; \
        grep \"^wharf-alice:x:$(id -u):\" /etc/passwd >/dev/null && echo passwd-ok; \
        (echo x > /data/y) 2>/dev/null && echo data-writable || echo data-read-only";
    let out = as_user(
        &alice,
        &work,
        wharf_bin(),
        &["run", "--image", "tiny", "--", "/bin/sh", "-c", script],
        &c.socket,
    );
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let expected = format!(
        "{}\ndata from the shared disk\nwrote\npasswd-ok\ndata-read-only\n",
        work.display()
    );
    assert_eq!(stdout(&out), expected);
    let meta = std::fs::metadata(work.join("output.txt")).unwrap();
    assert_eq!(
        meta.uid(),
        alice.uid,
        "files on shared storage belong to the user"
    );
    // The image itself was not changed: the job's directories and passwd live in its layer.
    let image = wharf_images::ImageStore::open(c.dir.join("images"))
        .unwrap()
        .get("tiny")
        .unwrap();
    assert!(!image.rootfs.join(work.strip_prefix("/").unwrap()).exists());
    assert!(!std::fs::read_to_string(image.rootfs.join("etc/passwd"))
        .unwrap()
        .contains("wharf-alice"));
}

#[test]
fn hostile_image_symlinks_cannot_point_mount_points_at_the_host() {
    if !can_run("hostile_image_symlinks_cannot_point_mount_points_at_the_host") {
        return;
    }
    let shared = scratch("wharf-shared-");
    let marker = format!("wharf-e2e-{}", std::process::id());
    let c = Cluster::start_with(&format!(
        "mounts = [\"{}:/srv/{marker}\"]",
        shared.path().display()
    ));
    // An image whose /srv is a symlink to the host's /etc (absolute).
    let rootfs = c.dir.join("hostile");
    mkrootfs(&rootfs, &["sh", "ls", "cat"]);
    std::os::unix::fs::symlink("/etc", rootfs.join("srv")).unwrap();
    c.import(&rootfs, "hostile");
    let alice = user("wharf-alice");
    let out = c.wharf_as(
        &alice,
        &[
            "run",
            "--image",
            "hostile",
            "--",
            "/bin/ls",
            &format!("/etc/{marker}"),
        ],
    );
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert!(
        !std::path::Path::new("/etc").join(&marker).exists(),
        "a mount point was made in the host's /etc"
    );
}

#[test]
fn setuid_binaries_give_no_privilege_and_no_agent_fd_leaks_in() {
    if !can_run("setuid_binaries_give_no_privilege_and_no_agent_fd_leaks_in") {
        return;
    }
    let c = Cluster::start();
    let rootfs = c.dir.join("suid");
    mkrootfs(&rootfs, &["sh", "id", "ls", "cat", "stat", "grep"]);
    // A setuid copy of `cat` owned by the host id container root maps to (`root_host_id`,
    // 65534 by default): inside, it is root's, and the kernel would honour the bit (a file of
    // an unmapped owner would not be). It prints its own credentials.
    let suid = rootfs.join("bin/suid-cat");
    std::fs::copy(rootfs.join("usr/bin/cat"), &suid).unwrap();
    nix::unistd::chown(&suid, Some(65534.into()), Some(65534.into())).unwrap();
    std::fs::set_permissions(&suid, std::fs::Permissions::from_mode(0o4755)).unwrap();
    c.import(&rootfs, "suid");
    let alice = user("whlife-alice");
    let out = c.run_sh(
        &alice,
        &["--image", "suid"],
        "stat -c 'owner %u %A' /bin/suid-cat; \
         suid-cat /proc/self/status | grep -E '^(Uid|Gid|CapEff|CapPrm|NoNewPrivs):'; \
         echo fds $(ls /proc/self/fd)",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let line = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in {text}"))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    // The premise: inside, the file is root's and setuid.
    assert_eq!(line("owner "), "0 -rwsr-xr-x", "{text}");
    let (u, g) = (alice.uid.to_string(), alice.gid.to_string());
    assert_eq!(
        line("Uid:"),
        [&*u, &u, &u, &u].join(" "),
        "setuid took effect: {text}"
    );
    assert_eq!(line("Gid:"), [&*g, &g, &g, &g].join(" "), "{text}");
    assert_eq!(line("CapEff:"), "0000000000000000", "{text}");
    assert_eq!(line("CapPrm:"), "0000000000000000", "{text}");
    assert_eq!(line("NoNewPrivs:"), "1", "{text}");
    // 0, 1 and 2, plus the directory `ls` itself opened: nothing of the agent or shim.
    assert_eq!(line("fds "), "0 1 2 3", "{text}");
}

#[test]
fn image_with_symlinked_proc_or_dev_is_refused() {
    if !can_run("image_with_symlinked_proc_or_dev_is_refused") {
        return;
    }
    let c = Cluster::start();
    let alice = user("wharf-alice");
    for (name, link) in [("symproc", "proc"), ("symdev", "dev")] {
        let rootfs = c.dir.join(name);
        mkrootfs(&rootfs, &["sh"]);
        std::fs::remove_dir(rootfs.join(link)).unwrap();
        std::os::unix::fs::symlink("/etc", rootfs.join(link)).unwrap();
        c.import(&rootfs, name);
        let out = c.run_sh(&alice, &["--image", name], "echo ran");
        assert_ne!(out.status.code(), Some(0), "{name} ran");
        assert!(
            stderr(&out).contains(&format!("image refused: /{link} must be a directory")),
            "{}",
            stderr(&out)
        );
        assert!(!stdout(&out).contains("ran"));
    }
}

#[test]
fn docker_backend_runs_jobs_as_their_user_through_the_agent() {
    if !can_run("docker_backend_runs_jobs_as_their_user_through_the_agent") {
        return;
    }
    if !std::process::Command::new("docker")
        .arg("info")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        assert!(
            std::env::var("WHARF_TEST_STRICT").as_deref() != Ok("1"),
            "needs the Docker engine"
        );
        eprintln!(
            "SKIPPED docker_backend_runs_jobs_as_their_user_through_the_agent: no Docker engine"
        );
        return;
    }
    let c = Cluster::start_with("backend = \"docker\"");
    let rootfs = c.dir.join("docker-rootfs");
    mkrootfs(&rootfs, &["sh", "id", "cat", "sleep"]);
    let tag = "wharf-e2e-docker:latest";
    let import = format!("tar -C '{}' -c . | docker import - {tag}", rootfs.display());
    assert!(std::process::Command::new("sh")
        .args(["-c", &import])
        .status()
        .unwrap()
        .success());
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !stdout(&c.wharf(&["nodes", "--json"])).contains("\"wharf-e2e-docker\"") {
        assert!(
            std::time::Instant::now() < deadline,
            "node never listed the engine image"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let alice = user("wharf-alice");
    let out = c.run_sh(
        &alice,
        &["--image", "wharf-e2e-docker"],
        "id -u; echo $WHARF_JOB_ID; echo hostfile $WHARF_HOSTFILE; cat \"$WHARF_HOSTFILE\"; \
         if [ -w \"$WHARF_HOSTFILE\" ]; then echo writable; else echo read-only; fi",
    );
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let text = stdout(&out);
    assert!(text.starts_with(&format!("{}\n", alice.uid)), "{text}");
    // The engine gets the job's hostfile too: one line for its one node, read-only.
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[2], "hostfile /tmp/wharf/hostfile", "{text}");
    assert!(
        lines[3].ends_with(" slots=1") && lines[3].split(' ').count() == 2,
        "{text}"
    );
    assert_eq!(lines[4], "read-only", "{text}");
    assert_eq!(lines.len(), 5, "{text}");
    // `wharf cancel --signal` reaches the container's program through the engine, and the
    // job goes on.
    let script = "trap 'echo got-usr1' USR1; trap 'echo got-term; exit 0' TERM; echo ready; \
                  while :; do sleep 0.2; done";
    let id = submitted_id(&c.wharf_as(
        &alice,
        &["submit", "--image", "wharf-e2e-docker", "--wrap", script],
    ));
    let out_file = c.home(&alice).join(format!("wharf-{id}.out"));
    c.wait_running(id);
    crate::cancel_signal::wait_lines(&c, id, &out_file, "ready", 1);
    let out = c.wharf_as(&alice, &["cancel", "--signal", "USR1", &id.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    crate::cancel_signal::wait_lines(&c, id, &out_file, "got-usr1", 1);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(crate::cancel_signal::count(&out_file, "got-usr1"), 1);
    assert_eq!(c.job(id)["state"], "RUNNING");
    // A signal sent just before the cancel still reaches the program, before the SIGTERM
    // (the shim reads requests once a second, and a cancel closes their directory).
    let out = c.wharf_as(&alice, &["cancel", "--signal", "USR1", &id.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    c.cancel_as(&alice, id);
    let text = std::fs::read_to_string(&out_file).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("got-")).collect();
    assert_eq!(lines, ["got-usr1", "got-usr1", "got-term"], "{text}");
    // The host image is not something the engine can run: refused with the reason.
    let out = c.wharf_as(&alice, &["run", "--image", "host", "--", "/bin/true"]);
    assert!(
        stderr(&out).contains("runs jobs with Docker"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn stack_limit_is_set_as_configured() {
    if !can_run("stack_limit_is_set_as_configured") {
        return;
    }
    let c = Cluster::start_with("stack = \"16M\"");
    let alice = user("wharf-alice");
    let out = c.run_sh(&alice, &[], "ulimit -s");
    assert_eq!(stdout(&out), "16384\n", "{}", stderr(&out));
}

/// One call of the profile's, with arguments for which the kernel, without the profile, answers
/// something other than EPERM (so the EPERM seen is the filter's), except where it checks a
/// capability the job lacks before anything else (`by_capability`): for those EPERM is the
/// kernel's answer too, and the filter is the second line behind it.
#[cfg(all(feature = "seccomp", target_arch = "x86_64"))]
struct Probe {
    name: &'static str,
    nr: libc::c_long,
    /// Perl arguments after the call number (a string through `w`: `syscall` writes to its
    /// string arguments, so they must be copies, not literals).
    args: &'static str,
    by_capability: bool,
}

#[cfg(all(feature = "seccomp", target_arch = "x86_64"))]
const PROBES: [Probe; 27] = {
    const fn p(
        name: &'static str,
        nr: libc::c_long,
        args: &'static str,
        by_capability: bool,
    ) -> Probe {
        Probe {
            name,
            nr,
            args,
            by_capability,
        }
    }
    [
        p("acct", libc::SYS_acct, "0", true),
        // An empty key type: EINVAL.
        p(
            "add_key",
            libc::SYS_add_key,
            "w('w('), w(')x'), 0, 0, -3",
            false,
        ),
        // An unknown command: EINVAL.
        p("bpf", libc::SYS_bpf, "999, 0, 0", false),
        // Reading the clock's state (modes 0) needs nothing: it succeeds.
        p("clock_adjtime", libc::SYS_clock_adjtime, "0, $timex", false),
        // An unknown clock: EINVAL.
        p("clock_settime", libc::SYS_clock_settime, "999, $ts", false),
        // Gone from the kernel: ENOSYS.
        p("create_module", 174, "0, 0", false),
        p("delete_module", libc::SYS_delete_module, "w('x'), 0", true),
        p("finit_module", libc::SYS_finit_module, "-1, w(''), 0", true),
        p("init_module", libc::SYS_init_module, "0, 0, w('')", true),
        p(
            "kexec_file_load",
            libc::SYS_kexec_file_load,
            "-1, -1, 0, w(''), 0",
            true,
        ),
        p("kexec_load", libc::SYS_kexec_load, "0, 0, 0, 0", true),
        // The session keyring's id: it succeeds.
        p("keyctl", libc::SYS_keyctl, "0, -3, 0", false),
        // Gone from the kernel: ENOSYS.
        p("lookup_dcookie", libc::SYS_lookup_dcookie, "0, 0, 0", false),
        // The target is looked up first: ENOENT.
        p(
            "mount",
            libc::SYS_mount,
            "w('none'), w('/nonexistent-wharf'), w('tmpfs'), 0, 0",
            false,
        ),
        p(
            "move_mount",
            libc::SYS_move_mount,
            "-1, w(''), -1, w(''), 0",
            true,
        ),
        // A bad directory descriptor: EBADF.
        p(
            "open_by_handle_at",
            libc::SYS_open_by_handle_at,
            "-1, $fh, 0",
            false,
        ),
        // No attributes: EFAULT.
        p(
            "perf_event_open",
            libc::SYS_perf_event_open,
            "0, 0, -1, -1, 0",
            false,
        ),
        p(
            "pivot_root",
            libc::SYS_pivot_root,
            "w('.w('), w(').')",
            true,
        ),
        // Q_SYNC of quota type 99: EINVAL.
        p("quotactl", libc::SYS_quotactl, "0x80000163, 0, 0, 0", false),
        p("reboot", libc::SYS_reboot, "0, 0, 0, 0", true),
        // No such key: ENOKEY.
        p(
            "request_key",
            libc::SYS_request_key,
            "w('user'), w('wharf-no-such-key'), 0, 0",
            false,
        ),
        // 2 000 000 microseconds: EINVAL.
        p("settimeofday", libc::SYS_settimeofday, "$tv, 0", false),
        p(
            "swapoff",
            libc::SYS_swapoff,
            "w('/nonexistent-wharf')",
            true,
        ),
        p(
            "swapon",
            libc::SYS_swapon,
            "w('/nonexistent-wharf'), 0",
            true,
        ),
        // Unknown flags: EINVAL.
        p("umount2", libc::SYS_umount2, "w('/'), 0xff00", false),
        // User-mode-only faults need no privilege: it succeeds.
        p("userfaultfd", libc::SYS_userfaultfd, "1", false),
        p("fsopen", libc::SYS_fsopen, "w('tmpfs'), 0", true),
    ]
};

/// Built with `--features seccomp`: every call the profile refuses fails with EPERM inside a
/// job, made raw (perl's `syscall`) by a process of the job's.
#[cfg(all(feature = "seccomp", target_arch = "x86_64"))]
#[test]
fn seccomp_profile_refuses_every_call_it_denies() {
    if !can_run("seccomp_profile_refuses_every_call_it_denies") {
        return;
    }
    let denied = wharf_runtime::seccomp_denied_calls();
    let mut names: Vec<&str> = PROBES.iter().map(|p| p.name).collect();
    let mut expected = denied.to_vec();
    names.sort_unstable();
    expected.sort_unstable();
    assert_eq!(names, expected, "every call the profile denies has a probe");
    let mut perl = String::from(
        "$timex = \"\\0\" x 208; $ts = pack('qq', 0, 0); $tv = pack('qq', 0, 2000000); \
         $fh = pack('Li', 8, 0) . \"\\0\" x 8; \
         sub w { my $s = $_[0]; $s } sub r { my ($n, $r, $e) = @_; print \"$n \", ($r == -1 ? $e : 'ok'), \"\\n\" } ",
    );
    for p in &PROBES {
        perl.push_str(&format!(
            "r('{}', syscall({}, {}), $!+0); ",
            p.name, p.nr, p.args
        ));
    }
    perl.push_str("open(my $s, '<', '/proc/self/status'); print grep { /^Seccomp:/ } <$s>;");
    let c = Cluster::start();
    let alice = user("whlife-alice");
    let out = c.wharf_as(&alice, &["run", "--", "/usr/bin/perl", "-e", &perl]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}{}", stderr(&out));
    assert!(text.contains("Seccomp:\t2\n"), "no filter: {text}");
    for p in &PROBES {
        let got = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{} ", p.name)))
            .unwrap_or_else(|| panic!("no answer for {}: {text}", p.name));
        let why = if p.by_capability {
            " (the kernel's own capability check also refuses it)"
        } else {
            ""
        };
        assert_eq!(got, libc::EPERM.to_string(), "{}{why}: {text}", p.name);
    }
}
