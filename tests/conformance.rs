//! The runtime conformance suite against the real OCI backend (the `wharf shim`), as root.
//! The fake backend runs the same suite in `runtime/tests/conformance_fake.rs`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use wharf_runtime::conformance::{run as run_suite, template, wait, Suite};
use wharf_runtime::Launcher;

/// Says why a test does not run: fails under WHARF_TEST_STRICT=1, else prints the reason.
fn skip(why: &str) {
    assert!(
        std::env::var("WHARF_TEST_STRICT").as_deref() != Ok("1"),
        "{why}"
    );
    eprintln!("SKIPPED {why}");
}

/// A scratch directory (0777, in /var/tmp) for a test that needs root; `None` (after saying
/// why, or failing under WHARF_TEST_STRICT=1) when not root.
fn scratch(test: &str, prefix: &str) -> Option<tempfile::TempDir> {
    if !nix::unistd::geteuid().is_root() {
        skip(&format!("{test}: needs root"));
        return None;
    }
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    Some(dir)
}

/// A root filesystem at `rootfs` holding these programs of this machine
/// (`examples/mkrootfs.sh`).
fn mkrootfs(rootfs: &Path, progs: &[&str]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/mkrootfs.sh");
    let ok = std::process::Command::new(script)
        .arg(rootfs)
        .args(progs)
        .status()
        .unwrap();
    assert!(ok.success(), "mkrootfs.sh {}", rootfs.display());
}

/// [`scratch`] for a test of SIF images, which also needs siftool and mksquashfs.
fn sif_scratch(test: &str, prefix: &str) -> Option<tempfile::TempDir> {
    let have = |t: &str| {
        std::process::Command::new("sh")
            .args(["-c", &format!("command -v {t}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !have("siftool") || !have("mksquashfs") {
        skip(&format!("{test}: needs siftool and mksquashfs"));
        return None;
    }
    scratch(test, prefix)
}

/// A SIF image at `sif` of a root filesystem made at `rootfs` from these programs of this
/// machine (`examples/mksif.sh`); returns its primary partition as (offset, size).
fn mksif(rootfs: &Path, progs: &[&str], sif: &Path) -> (u64, u64) {
    mkrootfs(rootfs, progs);
    let mksif = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/mksif.sh");
    assert!(std::process::Command::new(mksif)
        .arg(rootfs)
        .arg(sif)
        .status()
        .unwrap()
        .success());
    let part = wharf_images::sif::primary_partition(sif).unwrap();
    (part.offset, part.size)
}

#[test]
fn oci_backend_passes_the_conformance_suite() {
    let Some(dir) = scratch(
        "oci_backend_passes_the_conformance_suite",
        "wharf-conformance-",
    ) else {
        return;
    };
    let rootfs = dir.path().join("rootfs");
    mkrootfs(&rootfs, &["sh", "true", "false", "sleep"]);
    let backend = Launcher::new(PathBuf::from(env!("CARGO_BIN_EXE_wharf")));
    let suite = Suite {
        dir: dir.path().to_path_buf(),
        template: template("oci", &rootfs, 4243, 4243),
    };
    run_suite(&backend, &suite);
}

#[test]
fn sif_images_pass_the_conformance_suite() {
    let Some(dir) = sif_scratch(
        "sif_images_pass_the_conformance_suite",
        "wharf-conformance-",
    ) else {
        return;
    };
    let sif = dir.path().join("root.sif");
    let part = mksif(
        &dir.path().join("rootfs"),
        &["sh", "true", "false", "sleep"],
        &sif,
    );
    let mut template = template("sif", &sif, 4244, 4244);
    template.rootfs_partition = Some(part);
    let backend = Launcher::new(PathBuf::from(env!("CARGO_BIN_EXE_wharf")));
    run_suite(
        &backend,
        &Suite {
            dir: dir.path().to_path_buf(),
            template,
        },
    );
}

/// Makes an engine image `name` from a rootfs of this machine's programs (`docker import`).
pub fn docker_image(dir: &Path, name: &str, progs: &[&str]) -> bool {
    let docker_up = std::process::Command::new("docker")
        .arg("info")
        .output()
        .is_ok_and(|o| o.status.success());
    if !docker_up {
        skip("docker tests need the Docker engine (docker info failed)");
        return false;
    }
    let rootfs = dir.join(format!("{}-rootfs", name.replace([':', '/'], "-")));
    mkrootfs(&rootfs, progs);
    let import = format!(
        "tar -C '{}' -c . | docker import - '{name}'",
        rootfs.display()
    );
    let out = std::process::Command::new("sh")
        .args(["-c", &import])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "docker import: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    true
}

#[test]
fn docker_backend_passes_the_conformance_suite() {
    let Some(dir) = scratch(
        "docker_backend_passes_the_conformance_suite",
        "wharf-conformance-",
    ) else {
        return;
    };
    if !docker_image(
        dir.path(),
        "wharf-conformance:latest",
        &["sh", "true", "false", "sleep"],
    ) {
        return;
    }
    let mut template = template("docker", Path::new("/"), 4245, 4245);
    template.docker = Some(wharf_runtime::DockerTarget {
        socket: "/var/run/docker.sock".into(),
        image: "wharf-conformance:latest".into(),
    });
    let backend = wharf_runtime::DockerBackend::new(PathBuf::from(env!("CARGO_BIN_EXE_wharf")));
    run_suite(
        &backend,
        &Suite {
            dir: dir.path().to_path_buf(),
            template,
        },
    );
}

#[test]
fn docker_jobs_run_as_the_user_with_only_their_devices_and_no_privilege() {
    use nix::sys::stat::{makedev, mknod, Mode, SFlag};
    use wharf_runtime::{Backend, JobDir, JobStatus};
    let Some(dir) = scratch(
        "docker_jobs_run_as_the_user_with_only_their_devices_and_no_privilege",
        "wharf-docker-",
    ) else {
        return;
    };
    if !docker_image(
        dir.path(),
        "wharf-docker-test:latest",
        &["sh", "id", "grep", "ls", "head", "touch", "cat"],
    ) {
        return;
    }
    let dev = dir.path().join("dev");
    std::fs::create_dir_all(&dev).unwrap();
    for i in 0..4u64 {
        mknod(
            &dev.join(format!("nvidia{i}")),
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            makedev(195, i),
        )
        .unwrap();
    }
    let mut spec = template("dockersec", Path::new("/"), 4246, 4246);
    spec.docker = Some(wharf_runtime::DockerTarget {
        socket: "/var/run/docker.sock".into(),
        image: "wharf-docker-test:latest".into(),
    });
    spec.devices = [1u32, 3]
        .iter()
        .map(|i| {
            wharf_runtime::DeviceNode::from_host(
                &dev.join(format!("nvidia{i}")),
                &format!("/dev/nvidia{i}"),
            )
            .unwrap()
        })
        .collect();
    spec.argv = [
        "/bin/sh",
        "-c",
        "id -u; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; echo $(ls /dev | grep nvidia); \
        head -c1 /dev/nvidia1 2>&1; touch /x 2>/dev/null || echo ro; touch /tmp/x && echo tmp-ok",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    spec.id = format!("wharf-dockersec-{}", std::process::id());
    spec.stdout = dir.path().join("out");
    spec.stderr = spec.stdout.clone();
    spec.time_limit = Some(60);
    let backend = wharf_runtime::DockerBackend::new(PathBuf::from(env!("CARGO_BIN_EXE_wharf")));
    let jd = JobDir::new(dir.path().join("job"));
    backend.launch(&jd, &spec).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let outcome = loop {
        if let JobStatus::Exited(o) = backend.status(&jd) {
            break o;
        }
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let text = std::fs::read_to_string(&spec.stdout).unwrap();
    assert_eq!(outcome.exit_code, Some(0), "{outcome:?}\n{text}");
    let expected = "4246\nCapEff:\t0000000000000000\nNoNewPrivs:\t1\nnvidia1 nvidia3\nhead: cannot open '/dev/nvidia1' for reading: No such device or address\nro\ntmp-ok\n";
    assert_eq!(text, expected);
    let meta = std::fs::metadata(&spec.stdout).unwrap();
    assert_eq!(
        std::os::unix::fs::MetadataExt::uid(&meta),
        4246,
        "output file belongs to the user"
    );
    // The container is gone.
    let ps = std::process::Command::new("docker")
        .args(["ps", "-a", "--format", "{{.Names}}"])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&ps.stdout).contains(&spec.id));
}

/// Each byte a Docker job writes reaches its output files once: the engine's log is not
/// replayed into them on top of the live stream (which duplicated whatever the job wrote
/// while the engine was still reading its log). A job printing numbered lines as fast as it
/// can from its first instant, several times over.
#[test]
fn docker_output_reaches_the_files_exactly_once() {
    use wharf_runtime::{Backend, JobDir};
    let Some(dir) = scratch(
        "docker_output_reaches_the_files_exactly_once",
        "wharf-docker-",
    ) else {
        return;
    };
    if !docker_image(dir.path(), "wharf-docker-once:latest", &["sh"]) {
        return;
    }
    const LINES: usize = 3000;
    const RUNS: usize = 8;
    let backend = wharf_runtime::DockerBackend::new(PathBuf::from(env!("CARGO_BIN_EXE_wharf")));
    let mut spec = template("dockeronce", Path::new("/"), 4247, 4247);
    spec.docker = Some(wharf_runtime::DockerTarget {
        socket: "/var/run/docker.sock".into(),
        image: "wharf-docker-once:latest".into(),
    });
    spec.argv = [
        "/bin/sh",
        "-c",
        &format!("i=0; while [ $i -lt {LINES} ]; do echo o$i; echo e$i >&2; i=$((i+1)); done"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    spec.time_limit = Some(120);
    let expect = |tag: &str| -> String { (0..LINES).map(|i| format!("{tag}{i}\n")).collect() };
    // All at once: an engine busy starting the others is slow to answer each attach, which
    // is when a replay of the log would catch the job's first lines.
    let runs: Vec<_> = (0..RUNS)
        .map(|run| {
            let mut s = spec.clone();
            s.id = format!("wharf-dockeronce-{}-{run}", std::process::id());
            s.stdout = dir.path().join(format!("out-{run}"));
            s.stderr = dir.path().join(format!("err-{run}"));
            let jd = JobDir::new(dir.path().join(format!("job-{run}")));
            backend.launch(&jd, &s).unwrap();
            (s, jd)
        })
        .collect();
    let mut failures = Vec::new();
    for (run, (s, jd)) in runs.iter().enumerate() {
        let o = wait(&backend, jd, std::time::Duration::from_secs(120));
        backend.remove(jd).unwrap();
        assert_eq!(o.exit_code, Some(0), "run {run}: {o:?}");
        for (path, tag) in [(&s.stdout, "o"), (&s.stderr, "e")] {
            let text = std::fs::read_to_string(path).unwrap();
            if text != expect(tag) {
                let lines = text.lines().count();
                let repeated = lines - text.lines().collect::<std::collections::HashSet<_>>().len();
                failures.push(format!(
                    "run {run}, {}: {lines} lines for {LINES}, {repeated} repeated",
                    path.display()
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "output not written exactly once:\n{}",
        failures.join("\n")
    );
}

/// Runs `spec` in `dir` with the OCI backend and returns its outcome.
fn run_to_end(
    backend: &Launcher,
    dir: &Path,
    spec: &wharf_runtime::ContainerSpec,
) -> wharf_runtime::Outcome {
    let jd = wharf_runtime::JobDir::new(dir.to_path_buf());
    backend.launch(&jd, spec).unwrap();
    let o = wait(backend, &jd, std::time::Duration::from_secs(30));
    backend.remove(&jd).unwrap();
    o
}

#[test]
fn oci_sandbox_failures_name_their_cause_and_leave_nothing_behind() {
    let Some(dir) = scratch(
        "oci_sandbox_failures_name_their_cause_and_leave_nothing_behind",
        "wharf-failures-",
    ) else {
        return;
    };
    let rootfs = dir.path().join("rootfs");
    mkrootfs(&rootfs, &["sh", "true"]);
    // A program without `#!` that the kernel will not run is run by /bin/sh, as execvp does.
    std::fs::write(rootfs.join("plain-script"), "echo plain $1\n").unwrap();
    std::fs::set_permissions(
        rootfs.join("plain-script"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let backend = Launcher::new(PathBuf::from(env!("CARGO_BIN_EXE_wharf")));
    let mut spec = template("fail", &rootfs, 4245, 4245);
    let out = dir.path().join("out");
    spec.stdout = out.clone();
    spec.stderr = out.clone();

    let mut s = spec.clone();
    s.id = format!("fail-script-{}", std::process::id());
    s.argv = vec!["/plain-script".into(), "arg".into()];
    let o = run_to_end(&backend, &dir.path().join("job-script"), &s);
    assert_eq!((o.exit_code, o.error.as_deref()), (Some(0), None), "{o:?}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "plain arg\n");

    let gone = dir.path().join("gone");
    let mut cases = Vec::new();
    let mut s = spec.clone();
    s.binds = vec![wharf_runtime::Bind {
        source: gone.clone(),
        destination: "/data".into(),
        read_only: true,
        beneath: None,
    }];
    cases.push(("bind", s, format!("binding {}", gone.display())));
    let mut s = spec.clone();
    s.argv = vec!["no-such-program".into()];
    cases.push((
        "command",
        s,
        "command not found in the image: no-such-program".to_string(),
    ));
    let mut s = spec.clone();
    s.argv = vec!["/bin/sh".into(), "-c".into(), "true\0 ignored".into()];
    cases.push(("nul", s, "bad command: ".to_string()));
    let mut s = spec.clone();
    s.argv = vec!["/etc".into()];
    cases.push(("not a program", s, "cannot run /etc".to_string()));
    for (name, mut s, want) in cases {
        s.id = format!("fail-{}-{}", name.replace(' ', "-"), std::process::id());
        let job = dir.path().join(format!("job-{}", name.replace(' ', "-")));
        let o = run_to_end(&backend, &job, &s);
        let error = o.error.clone().unwrap_or_default();
        assert!(error.contains(&want), "{name}: {o:?}");
        assert!(o.started_ms.is_none(), "{name}: counted as started: {o:?}");
        assert!(
            wharf_runtime::cgroup_dirs(&s.cgroup_path()).is_empty(),
            "{name}: cgroup left"
        );
        let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(
            !table.contains(job.to_str().unwrap()),
            "{name}: the node has the job's mounts"
        );
    }
}

/// A SIF file the user could not open by its own path (a 0700 directory of root's), named
/// through a symlink in a directory anyone may write: the shim opens the path as the user,
/// whatever was checked before it, and refuses.
#[test]
fn shim_opens_the_sif_file_as_the_user() {
    let Some(dir) = sif_scratch("shim_opens_the_sif_file_as_the_user", "wharf-sif-user-") else {
        return;
    };
    let vault = dir.path().join("vault");
    let sif = vault.join("root.sif");
    let part = mksif(&vault.join("rootfs"), &["sh", "true"], &sif);
    std::fs::set_permissions(&sif, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::set_permissions(&vault, std::fs::Permissions::from_mode(0o700)).unwrap();
    let link = dir.path().join("borrowed.sif");
    std::os::unix::fs::symlink(&sif, &link).unwrap();
    let backend = Launcher::new(PathBuf::from(env!("CARGO_BIN_EXE_wharf")));
    let mut spec = template("sif-user", &link, 4246, 4246);
    spec.id = format!("sif-user-{}", std::process::id());
    spec.rootfs_partition = Some(part);
    spec.argv = vec!["/bin/true".into()];
    spec.stdout = dir.path().join("out");
    spec.stderr = spec.stdout.clone();
    let o = run_to_end(&backend, &dir.path().join("job"), &spec);
    let error = o.error.clone().unwrap_or_default();
    assert!(
        error.contains("cannot be opened by uid 4246") && error.contains("Permission denied"),
        "{o:?}"
    );
    assert!(o.started_ms.is_none(), "it ran: {o:?}");
    // Root's own job may use it: the refusal is the user's permissions, not the symlink.
    let mut spec = spec.clone();
    (spec.uid, spec.gid, spec.groups) = (0, 0, vec![0]);
    let o = run_to_end(&backend, &dir.path().join("job-root"), &spec);
    assert_eq!((o.exit_code, o.error.as_deref()), (Some(0), None), "{o:?}");
}

/// A user's bind is resolved by the shim, as the user, beneath its allowed directory and
/// through no symlink, whatever the path pointed to when the node checked it.
#[test]
fn shim_resolves_user_binds_beneath_their_allowed_directory() {
    let Some(dir) = scratch(
        "shim_resolves_user_binds_beneath_their_allowed_directory",
        "wharf-bind-user-",
    ) else {
        return;
    };
    let rootfs = dir.path().join("rootfs");
    mkrootfs(&rootfs, &["sh", "cat"]);
    let allowed = dir.path().join("allowed");
    let data = allowed.join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("marker"), "inside\n").unwrap();
    std::os::unix::fs::symlink("/etc", allowed.join("to-etc")).unwrap();
    std::os::unix::fs::symlink("data", allowed.join("to-data")).unwrap();
    let locked = allowed.join("locked");
    std::fs::create_dir_all(locked.join("inner")).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700)).unwrap();
    let backend = Launcher::new(PathBuf::from(env!("CARGO_BIN_EXE_wharf")));
    let mut spec = template("bind-user", &rootfs, 4247, 4247);
    let out = dir.path().join("out");
    spec.stdout = out.clone();
    spec.stderr = out.clone();
    spec.argv = vec!["/bin/cat".into(), "/in/marker".into()];
    let bind = |source: PathBuf| wharf_runtime::Bind {
        source,
        destination: "/in".into(),
        read_only: true,
        beneath: Some(allowed.clone()),
    };
    for (name, source, want) in [
        ("plain", data.clone(), None),
        ("etc", allowed.join("to-etc"), Some("a symlink")),
        ("inside", allowed.join("to-data"), Some("a symlink")),
        ("locked", locked.join("inner"), Some("you cannot reach")),
        ("outside", PathBuf::from("/etc"), Some("not under")),
    ] {
        let mut s = spec.clone();
        s.id = format!("bind-user-{name}-{}", std::process::id());
        s.binds = vec![bind(source)];
        let o = run_to_end(&backend, &dir.path().join(format!("job-{name}")), &s);
        match want {
            None => {
                assert_eq!((o.exit_code, o.error.as_deref()), (Some(0), None), "{o:?}");
                assert_eq!(std::fs::read_to_string(&out).unwrap(), "inside\n");
            }
            Some(want) => {
                let error = o.error.clone().unwrap_or_default();
                assert!(error.contains(want), "{name}: {o:?}");
                assert!(o.started_ms.is_none(), "{name}: it ran: {o:?}");
            }
        }
    }
}

#[test]
fn a_descriptor_the_shim_inherits_never_reaches_the_job() {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let Some(dir) = scratch(
        "a_descriptor_the_shim_inherits_never_reaches_the_job",
        "wharf-fds-",
    ) else {
        return;
    };
    let rootfs = dir.path().join("rootfs");
    mkrootfs(&rootfs, &["sh", "ls", "sleep"]);
    let mut spec = template("fds", &rootfs, 4247, 4247);
    spec.id = format!("fds-{}", std::process::id());
    spec.argv = ["/bin/sh", "-c", "echo $(ls /proc/self/fd); sleep 1"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    spec.stdout = dir.path().join("out");
    spec.stderr = spec.stdout.clone();
    let jd = wharf_runtime::JobDir::new(dir.path().join("job"));
    jd.create(&spec).unwrap();
    // The shim is started directly with descriptor 9 open and inheritable (as a careless
    // parent would leave it), so only the sandbox's own close step can keep it from the job.
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "the agent's").unwrap();
    let held = std::fs::File::open(&secret).unwrap();
    let from = held.as_raw_fd();
    let mut shim = std::process::Command::new(env!("CARGO_BIN_EXE_wharf"));
    shim.arg("shim").arg(jd.path());
    // SAFETY: dup2 is async-signal-safe; the new descriptor has no close-on-exec flag.
    unsafe {
        shim.pre_exec(move || {
            if libc::dup2(from, 9) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = shim.spawn().unwrap();
    // The premise: the shim holds it.
    let fd9 = format!("/proc/{}/fd/9", child.id());
    assert_eq!(std::fs::read_link(&fd9).ok(), Some(secret.clone()), "{fd9}");
    assert!(child.wait().unwrap().success());
    let outcome = jd.read_outcome().expect("outcome");
    assert_eq!(
        (outcome.exit_code, outcome.error.as_deref()),
        (Some(0), None),
        "{outcome:?}"
    );
    // 0, 1 and 2, plus the directory `ls` itself opened.
    assert_eq!(std::fs::read_to_string(&spec.stdout).unwrap(), "0 1 2 3\n");
    drop(held);
}

/// The node's own binds (site paths, CDI driver files) may pass through symlinks in the root,
/// as driver files do in real installs (`/lib64 -> usr/lib64`, say), but never land on what the
/// sandbox makes: a destination whose symlink leads to `/dev` is refused with where it led,
/// and the bound directory gains nothing.
#[test]
fn node_binds_may_pass_through_symlinks_but_never_land_on_what_the_sandbox_makes() {
    let Some(dir) = scratch(
        "node_binds_may_pass_through_symlinks_but_never_land_on_what_the_sandbox_makes",
        "wharf-nodebind-",
    ) else {
        return;
    };
    let rootfs = dir.path().join("rootfs");
    mkrootfs(&rootfs, &["sh", "cat", "ls"]);
    std::fs::create_dir_all(rootfs.join("usr/lib")).unwrap();
    std::os::unix::fs::symlink("usr/lib", rootfs.join("drivers")).unwrap();
    std::os::unix::fs::symlink("/dev", rootfs.join("data")).unwrap();
    let driver = dir.path().join("libdriver.so");
    std::fs::write(&driver, "driver\n").unwrap();
    let site = dir.path().join("site");
    std::fs::create_dir(&site).unwrap();
    std::fs::set_permissions(&site, std::fs::Permissions::from_mode(0o777)).unwrap();
    let backend = Launcher::new(PathBuf::from(env!("CARGO_BIN_EXE_wharf")));
    let mut spec = template("nodebind", &rootfs, 4250, 4250);
    let out = dir.path().join("out");
    spec.stdout = out.clone();
    spec.stderr = out.clone();
    let node_bind = |source: &Path, destination: &str| wharf_runtime::Bind {
        source: source.to_path_buf(),
        destination: destination.into(),
        read_only: true,
        beneath: None,
    };

    let mut s = spec.clone();
    s.id = format!("nodebind-ok-{}", std::process::id());
    s.binds = vec![node_bind(&driver, "/drivers/libdriver.so")];
    s.argv = vec!["/bin/cat".into(), "/usr/lib/libdriver.so".into()];
    let o = run_to_end(&backend, &dir.path().join("job-ok"), &s);
    assert_eq!((o.exit_code, o.error.as_deref()), (Some(0), None), "{o:?}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "driver\n");

    let mut s = spec.clone();
    s.id = format!("nodebind-dev-{}", std::process::id());
    s.binds = vec![node_bind(&site, "/data")];
    s.argv = vec!["/bin/ls".into(), "/dev".into()];
    let o = run_to_end(&backend, &dir.path().join("job-dev"), &s);
    let error = o.error.clone().unwrap_or_default();
    assert!(
        error.contains("mount point /data leads to /dev") && o.started_ms.is_none(),
        "{o:?}"
    );
    let made: Vec<_> = std::fs::read_dir(&site).unwrap().flatten().collect();
    assert!(
        made.is_empty(),
        "the sandbox made {made:?} in the bound directory"
    );
}

/// A task's input from the agent ends only where the agent writes its end: an agent that goes
/// away meanwhile (a restart) ends nothing, since the shim holds a writer of its own; the next
/// agent opens the pipe again and goes on, and once the end is written the woken shim lets go
/// and the task reads its end. On a shim without its own writer the task read its end when
/// the first agent went, and counted 3 bytes.
#[test]
fn a_tasks_input_ends_only_where_the_agent_writes_its_end() {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    use std::time::{Duration, Instant};
    let Some(dir) = scratch(
        "a_tasks_input_ends_only_where_the_agent_writes_its_end",
        "wharf-input-",
    ) else {
        return;
    };
    let rootfs = dir.path().join("rootfs");
    mkrootfs(&rootfs, &["sh", "wc"]);
    let mut spec = template("input", &rootfs, 4249, 4249);
    spec.id = format!("input-{}", std::process::id());
    spec.argv = ["/bin/sh", "-c", "wc -c"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    spec.stdout = dir.path().join("out");
    spec.stderr = spec.stdout.clone();
    spec.capture_stdin = true;
    let backend = Launcher::new(PathBuf::from(env!("CARGO_BIN_EXE_wharf")));
    let jd = wharf_runtime::JobDir::new(dir.path().join("job"));
    backend.launch(&jd, &spec).unwrap();
    // The agent's side: the pipe, opened once the shim reads it.
    let open = || {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let opened = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(jd.stdin_pipe());
            match opened {
                Ok(w) => return w,
                Err(e) => assert!(Instant::now() < deadline, "no input pipe: {e}"),
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let mut w = open();
    std::fs::write(jd.stdin_hold(), b"").unwrap();
    std::fs::write(jd.stdin_ready(), b"").unwrap();
    w.write_all(b"abc").unwrap();
    drop(w);
    // Away for a while: the task goes on waiting for more.
    let started = Instant::now() + Duration::from_secs(30);
    while !jd.started().exists() {
        assert!(Instant::now() < started, "the task never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        matches!(
            backend.status(&jd),
            wharf_runtime::JobStatus::Running { .. }
        ),
        "{:?}",
        backend.status(&jd)
    );
    let mut w = open();
    w.write_all(b"de").unwrap();
    drop(w);
    std::fs::write(jd.stdin_end(), b"").unwrap();
    // The wake makes the end prompt (the shim also looks once a second: how soon is not
    // asserted here); a shim without its handler would die of it, and the job be lost.
    backend.input_ended(&jd);
    let outcome = wait(&backend, &jd, Duration::from_secs(30));
    assert_eq!(
        (outcome.exit_code, outcome.error.as_deref()),
        (Some(0), None),
        "{outcome:?}"
    );
    assert_eq!(std::fs::read_to_string(&spec.stdout).unwrap().trim(), "5");
    backend.remove(&jd).unwrap();
}
