//! Paths a user names (a SIF image, `--mount` sources and destinations) are used only as that
//! user could use them, as they were when checked, and never to make the sandbox write into
//! the user's host directories.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::harness::*;

fn chown(path: &Path, user: &User) {
    nix::unistd::chown(path, Some(user.uid.into()), Some(user.gid.into())).unwrap();
}

fn mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The names in `dir`, sorted.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn sif_behind_a_symlink_into_a_root_only_directory_is_refused() {
    if !can_run("sif_behind_a_symlink_into_a_root_only_directory_is_refused") || !sif_tools() {
        return;
    }
    let c = Cluster::start();
    let dir = scratch("wharf-sif-vault-");
    mode(dir.path(), 0o755);
    // Root's own image: the file is 0644 but its directory is 0700.
    let vault = dir.path().join("vault");
    std::fs::create_dir(&vault).unwrap();
    let root = vault.join("root");
    mkrootfs(&root, &["sh", "true"]);
    let sif = vault.join("private.sif");
    mksif(&root, &sif);
    mode(&sif, 0o644);
    mode(&vault, 0o700);
    let mallory = user("whmnt-sif");
    // A symlink to it in a directory the user owns.
    let link = c.home(&mallory).join("borrowed.sif");
    std::os::unix::fs::symlink(&sif, &link).unwrap();
    for image in [&link, &sif] {
        let out = c.wharf_as(
            &mallory,
            &["run", "--image", image.to_str().unwrap(), "--", "/bin/true"],
        );
        assert_ne!(
            out.status.code(),
            Some(0),
            "{} ran as {}",
            image.display(),
            mallory.name
        );
        assert!(
            stderr(&out).contains("not readable by whmnt-sif"),
            "{}: {}",
            image.display(),
            stderr(&out)
        );
    }
}

/// Exchanges `a` and `b` (renameat2 RENAME_EXCHANGE).
fn exchange(a: &Path, b: &Path) {
    nix::fcntl::renameat2(None, a, None, b, nix::fcntl::RenameFlags::RENAME_EXCHANGE)
        .unwrap_or_else(|e| panic!("exchanging {} and {}: {e}", a.display(), b.display()));
}

#[test]
fn mount_source_swapped_for_symlinks_never_binds_outside_the_allowed_root() {
    if !can_run("mount_source_swapped_for_symlinks_never_binds_outside_the_allowed_root") {
        return;
    }
    let allowed = scratch("wharf-allowed-");
    let c = allowed_cluster(allowed.path(), "");
    c.import_tiny();
    swap_race(&c, allowed.path(), "tiny", 120);
}

#[test]
fn docker_mount_source_swapped_for_symlinks_never_binds_outside_the_allowed_root() {
    let allowed = scratch("wharf-allowed-");
    let Some(c) = docker_cluster(
        "docker_mount_source_swapped_for_symlinks_never_binds_outside_the_allowed_root",
        allowed.path(),
    ) else {
        return;
    };
    swap_race(&c, allowed.path(), DOCKER_IMAGE, 100);
    // Nothing staged for the engine is left mounted on the node.
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!table.contains(c.dir.to_str().unwrap()), "{table}");
}

/// The engine image the Docker tests run.
const DOCKER_IMAGE: &str = "whmnt-e2e-docker";

/// A cluster whose node runs jobs with Docker and may bind from under `allowed`, with an
/// engine image [`DOCKER_IMAGE`]; `None` (after saying why) without an engine.
fn docker_cluster(test: &str, allowed: &Path) -> Option<Cluster> {
    if !can_run(test) {
        return None;
    }
    if !Command::new("docker")
        .arg("info")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        let why = format!("{test}: needs the Docker engine (docker info failed)");
        assert!(
            std::env::var("WHARF_TEST_STRICT").as_deref() != Ok("1"),
            "{why}"
        );
        eprintln!("SKIPPED {why}");
        return None;
    }
    let c = allowed_cluster(allowed, "backend = \"docker\"\n");
    docker_import(&c, DOCKER_IMAGE, &["sh", "ls", "cat", "sleep"], |_| {});
    Some(c)
}

/// A cluster whose node may bind from under `allowed` (made 0755), with these `extra` lines
/// of its configuration.
fn allowed_cluster(allowed: &Path, extra: &str) -> Cluster {
    mode(allowed, 0o755);
    Cluster::start_with(&format!(
        "{extra}allowed_mounts = [\"{}\"]",
        allowed.display()
    ))
}

/// Makes the engine image `name` from a rootfs of these programs of this machine, changed by
/// `edit` first, and waits until `c`'s node lists it.
fn docker_import(c: &Cluster, name: &str, progs: &[&str], edit: impl FnOnce(&Path)) {
    let rootfs = c.dir.join(format!("{name}-rootfs"));
    mkrootfs(&rootfs, progs);
    edit(&rootfs);
    let import = format!(
        "tar -C '{}' -c . | docker import - {name}:latest >/dev/null",
        rootfs.display()
    );
    assert!(Command::new("sh")
        .args(["-c", &import])
        .status()
        .unwrap()
        .success());
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !stdout(&c.wharf(&["nodes", "--json"])).contains(&format!("\"{name}\"")) {
        assert!(
            std::time::Instant::now() < deadline,
            "node never listed the engine image"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Launches `jobs` jobs of `image` binding the user's `data` directory, under `allowed`, while
/// another thread keeps exchanging it with symlinks to /etc and /proc (what the user's own
/// process could do): every job sees the directory or is refused, none sees the host.
fn swap_race(c: &Cluster, allowed: &Path, image: &str, jobs: u64) {
    let mallory = user("whmnt-race");
    let mine = allowed.join("whmnt-race");
    let data = mine.join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("marker"), "").unwrap();
    let (to_etc, to_proc) = (mine.join("to-etc"), mine.join("to-proc"));
    std::os::unix::fs::symlink("/etc", &to_etc).unwrap();
    std::os::unix::fs::symlink("/proc", &to_proc).unwrap();
    for p in [&mine, &data, &data.join("marker")] {
        chown(p, &mallory);
    }
    let outputs = c.home(&mallory);

    // `data` is, by turns, the directory, a symlink to /etc and one to /proc, for as long as
    // the jobs launch.
    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    let swapper = {
        let (stop, swaps, data) = (stop.clone(), swaps.clone(), data.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                for link in [&to_etc, &to_proc] {
                    exchange(&data, link);
                    std::thread::yield_now();
                    exchange(&data, link);
                    swaps.fetch_add(2, Ordering::Relaxed);
                    std::thread::yield_now();
                }
            }
        })
    };
    let bind = format!("{}:/data", data.display());
    let out_pattern = format!("{}/race-%j.out", outputs.display());
    let ids: Vec<u64> = (0..jobs)
        .map(|_| {
            submitted_id(&c.wharf_as(
                &mallory,
                &[
                    "submit",
                    "--image",
                    image,
                    "--mount",
                    &bind,
                    "--output",
                    &out_pattern,
                    "--wrap",
                    "ls -A /data",
                ],
            ))
        })
        .collect();
    let mut seen = Vec::new();
    let (mut clean, mut by_node, mut by_shim) = (0, 0, 0);
    for id in &ids {
        let job = c.wait_done(*id, Duration::from_secs(120));
        let out =
            std::fs::read_to_string(outputs.join(format!("race-{id}.out"))).unwrap_or_default();
        let reason = job["reason"].as_str().unwrap_or_default();
        match (job["state"].as_str(), out.as_str()) {
            (Some("COMPLETED"), "marker\n") => clean += 1,
            // The node's early check saw a symlink out of the allowed directory ...
            (Some("FAILED"), "") if reason.contains("is not under a path this node allows") => {
                by_node += 1
            }
            // ... or the shim's own resolution, as the user, met the symlink.
            (Some("FAILED"), "") if reason.contains("a symlink") => by_shim += 1,
            _ => {
                let what = if out.contains("passwd") {
                    "the host's /etc"
                } else if out.contains("self") {
                    "the host's /proc"
                } else {
                    "something else"
                };
                let short: String = out.chars().take(60).collect();
                seen.push(format!(
                    "job {id}: {} {reason:?} ({what}): {short:?}",
                    job["state"]
                ));
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    eprintln!(
        "{jobs} jobs: {clean} saw the user's directory, {by_node} refused by the node's check, \
         {by_shim} by the shim's, {} saw something else; {} swaps",
        seen.len(),
        swaps.load(Ordering::Relaxed)
    );
    assert!(
        seen.is_empty(),
        "{} of {jobs} jobs saw something outside the allowed directory:\n{}",
        seen.len(),
        seen.join("\n")
    );
    assert!(
        swaps.load(Ordering::Relaxed) > jobs,
        "the swapper hardly ran"
    );
    assert!(clean > 0, "no job ever saw the user's directory");
}

#[test]
fn mounts_onto_what_the_sandbox_makes_are_refused_at_submit() {
    if !can_run("mounts_onto_what_the_sandbox_makes_are_refused_at_submit") {
        return;
    }
    let c = Cluster::start();
    let mallory = user("whmnt-dest");
    let src = c.home(&mallory);
    for (dest, expect) in [
        ("/", "not `/`".to_string()),
        ("//", "at or under / (the whole root)".to_string()),
        (
            "/dev",
            "at or under /dev, which the sandbox makes itself".into(),
        ),
        (
            "/dev/x",
            "at or under /dev, which the sandbox makes itself".into(),
        ),
        (
            "/dev/shm",
            "at or under /dev, which the sandbox makes itself".into(),
        ),
        (
            "/proc",
            "at or under /proc, which the sandbox makes itself".into(),
        ),
        (
            "/sys/fs",
            "at or under /sys, which the sandbox makes itself".into(),
        ),
    ] {
        let bind = format!("{}:{dest}", src.display());
        let out = c.wharf_as(&mallory, &["submit", "--mount", &bind, "--wrap", "true"]);
        assert_ne!(out.status.code(), Some(0), "{bind} accepted");
        assert!(stderr(&out).contains(&expect), "{bind}: {}", stderr(&out));
    }
    let queue = c.wharf(&["queue", "--json"]);
    assert!(!stdout(&queue).contains("whmnt-dest"), "{}", stdout(&queue));
}

#[test]
fn a_job_makes_nothing_in_the_users_bound_directory() {
    if !can_run("a_job_makes_nothing_in_the_users_bound_directory") {
        return;
    }
    let allowed = scratch("wharf-allowed-");
    let c = allowed_cluster(allowed.path(), "");
    c.import_tiny();
    // Over the sandbox's /dev (refused; it used to get /dev's symlinks), its private /tmp
    // (replaced by the bind), a plain directory, and a second bind inside the first, whose
    // mount point the user's directory lacks (the sandbox makes none there: it fails).
    bound_dir_untouched(
        &c,
        allowed.path(),
        "tiny",
        &[
            (&["/dev"], Seen::Refused),
            (&["/tmp"], Seen::Marker),
            (&["/data"], Seen::Marker),
            (&["/data", "/data/sub"], Seen::Failed),
        ],
    );
}

#[test]
fn docker_job_makes_nothing_in_the_users_bound_directory() {
    let allowed = scratch("wharf-allowed-");
    let Some(c) = docker_cluster(
        "docker_job_makes_nothing_in_the_users_bound_directory",
        allowed.path(),
    ) else {
        return;
    };
    // The engine would make a nested bind's mount point in the user's directory: refused.
    bound_dir_untouched(
        &c,
        allowed.path(),
        DOCKER_IMAGE,
        &[
            (&["/data", "/data/sub"], Seen::Failed),
            (&["/data"], Seen::Marker),
            (&["/dev"], Seen::Refused),
        ],
    );
}

/// How a job with some binds of the user's directory ended.
#[derive(Debug, PartialEq)]
enum Seen {
    /// Refused at submit.
    Refused,
    /// Accepted, then failed.
    Failed,
    /// Ran and printed the directory's marker, once.
    Marker,
}

/// The user's own directory under `allowed`, named after them, holding a file `marker`
/// ("mine").
fn users_dir(allowed: &Path, user: &User) -> std::path::PathBuf {
    let mine = allowed.join(&user.name);
    std::fs::create_dir(&mine).unwrap();
    std::fs::write(mine.join("marker"), "mine\n").unwrap();
    chown(&mine, user);
    mine
}

/// Submits, as `user`, a job of `image` with these `--mount`s that runs `script`.
fn submit_with_mounts(
    c: &Cluster,
    user: &User,
    image: &str,
    mounts: &[String],
    script: &str,
) -> std::process::Output {
    let mut args = vec!["submit", "--image", image];
    for m in mounts {
        args.extend(["--mount", m.as_str()]);
    }
    args.extend(["--wrap", script]);
    c.wharf_as(user, &args)
}

/// Runs a job of `image` per case, binding the user's directory (under `allowed`) at each of
/// the case's destinations, and checks how it ended and that the directory is unchanged.
fn bound_dir_untouched(c: &Cluster, allowed: &Path, image: &str, cases: &[(&[&str], Seen)]) {
    let mallory = user("whmnt-bound");
    let mine = users_dir(allowed, &mallory);
    let before = entries(&mine);
    for (dests, want) in cases {
        let mounts: Vec<String> = dests
            .iter()
            .map(|d| format!("{}:{d}", mine.display()))
            .collect();
        let script = format!("cat {}/marker", dests[0]);
        let out = submit_with_mounts(c, &mallory, image, &mounts, &script);
        let (got, why) = if out.status.success() {
            let id = submitted_id(&out);
            let job = c.wait_done(id, Duration::from_secs(60));
            let why = job["reason"].as_str().unwrap_or_default().to_string();
            if job["state"] == "COMPLETED" {
                let output = job["spec"]["output"]
                    .as_str()
                    .unwrap()
                    .replace("%j", &id.to_string());
                let text = std::fs::read_to_string(c.home(&mallory).join(output)).unwrap();
                let marker = text == "mine\n";
                (if marker { Seen::Marker } else { Seen::Failed }, text)
            } else {
                (Seen::Failed, why)
            }
        } else {
            (Seen::Refused, stderr(&out))
        };
        assert_eq!(
            entries(&mine),
            before,
            "a job with {dests:?} made entries in the user's directory"
        );
        eprintln!("{image} {dests:?}: {got:?}: {}", why.trim());
        assert_eq!(&got, want, "{dests:?}: {why}");
    }
}

#[test]
fn docker_bind_staged_by_a_killed_shim_is_detached_before_its_job_directory_goes() {
    let allowed = scratch("wharf-allowed-");
    let Some(c) = docker_cluster(
        "docker_bind_staged_by_a_killed_shim_is_detached_before_its_job_directory_goes",
        allowed.path(),
    ) else {
        return;
    };
    let mallory = user("whmnt-staged");
    let mine = users_dir(allowed.path(), &mallory);
    let bind = format!("{}:/data", mine.display());
    let id = submitted_id(&c.wharf_as(
        &mallory,
        &[
            "submit",
            "--image",
            DOCKER_IMAGE,
            "--mount",
            &bind,
            "--wrap",
            "sleep 60",
        ],
    ));
    c.wait_running(id);
    let job_dir = c.dir.join("agent/jobs").join(id.to_string());
    let staged = job_dir.join("binds/0");
    assert!(
        staged.join("marker").exists(),
        "nothing staged at {staged:?}"
    );
    // The shim dies with the bind attached: the node cleans up after it and removes the job
    // directory, which must not take the user's files along.
    c.kill9_shim(id);
    c.wait_done(id, Duration::from_secs(60));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while job_dir.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "{} was never removed; log:\n{}",
            job_dir.display(),
            c.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(entries(&mine), ["marker"]);
    assert_eq!(
        std::fs::read_to_string(mine.join("marker")).unwrap(),
        "mine\n"
    );
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!table.contains(c.dir.to_str().unwrap()), "{table}");
}

/// A `--mount` destination is text; where it lands is what the root has there. A symlink
/// (in an outer bind of the user's, in the image, or in the host's root) aimed a bind at the
/// sandbox's `/dev`, and the sandbox then made its `/dev` symlinks (fd, stdin, stdout,
/// stderr, ptmx) in the user's host directory. Each case is refused with the reason, the
/// user's directory gains nothing, and a plain nested bind still works.
#[test]
fn a_mount_point_reached_through_a_symlink_never_lands_on_what_the_sandbox_makes() {
    if !can_run("a_mount_point_reached_through_a_symlink_never_lands_on_what_the_sandbox_makes") {
        return;
    }
    let allowed = scratch("wharf-allowed-");
    let c = allowed_cluster(allowed.path(), "");
    // An image whose /data is a symlink to /dev.
    let rootfs = allowed.path().join("linked-rootfs");
    mkrootfs(&rootfs, &["sh", "cat", "ls"]);
    std::os::unix::fs::symlink("/dev", rootfs.join("data")).unwrap();
    c.import(&rootfs, "linked");
    c.import_tiny();
    let mallory = user("whfr-link");
    let mine = allowed.path().join("whfr-link");
    // `outer/x` and `outer/real` are where the inner bind goes: through a symlink to /dev,
    // or a plain directory; `inner` is writable by anyone (the sandbox's root is nobody),
    // the worst case.
    let (outer, inner) = (mine.join("outer"), mine.join("inner"));
    for d in [&mine, &outer, &inner, &outer.join("real")] {
        std::fs::create_dir_all(d).unwrap();
        chown(d, &mallory);
    }
    mode(&inner, 0o777);
    std::fs::write(inner.join("marker"), "mine\n").unwrap();
    for link in [outer.join("x"), mine.join("dev-link")] {
        std::os::unix::fs::symlink("/dev", &link).unwrap();
        nix::unistd::fchownat(
            None,
            &link,
            Some(mallory.uid.into()),
            Some(mallory.gid.into()),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .unwrap();
    }
    let before = entries(&inner);
    let (o, i) = (outer.display(), inner.display());
    let host_link = format!("{}/dev-link", mine.display());
    let cases: [(&str, Vec<String>, &str, bool); 4] = [
        // A nested bind through the outer bind's symlink.
        (
            "tiny",
            vec![format!("{o}:/data"), format!("{i}:/data/x")],
            "/data/x",
            false,
        ),
        // The image's symlink.
        ("linked", vec![format!("{i}:/data")], "/data", false),
        // The host's root, through a symlink of the user's.
        ("host", vec![format!("{i}:{host_link}")], &host_link, false),
        // A nested bind through no symlink still works.
        (
            "tiny",
            vec![format!("{o}:/data"), format!("{i}:/data/real")],
            "/data/real",
            true,
        ),
    ];
    for (image, mounts, dest, runs) in cases {
        let script = format!("cat {dest}/marker && ls /dev");
        let out = submit_with_mounts(&c, &mallory, image, &mounts, &script);
        assert!(out.status.success(), "{mounts:?}: {}", stderr(&out));
        let job = c.wait_done(submitted_id(&out), Duration::from_secs(60));
        let reason = job["reason"].as_str().unwrap_or_default();
        eprintln!("{image} {mounts:?}: {} {reason}", job["state"]);
        assert_eq!(
            entries(&inner),
            before,
            "{image} {mounts:?} made entries in the user's directory: {job}"
        );
        if runs {
            assert_eq!(job["state"], "COMPLETED", "{mounts:?}: {job}");
        } else {
            assert_eq!(job["state"], "FAILED", "{mounts:?}: {job}");
            assert!(
                reason.contains(&format!("mount point {dest}"))
                    && reason.contains("through no symlink"),
                "{mounts:?}: {reason}"
            );
        }
    }
}

/// The Docker engine's runtime resolves a destination through the image's symlinks, as real
/// root, and makes its `/dev` nodes and symlinks after the binds: an image whose `/data` is a
/// symlink to `/dev` had a bind at `/data` receive root-owned device nodes (null, zero, tty,
/// ...) and `/dev` symlinks in the user's host directory. Refused with the reason; the
/// directory gains nothing.
#[test]
fn docker_mount_point_reached_through_an_image_symlink_is_refused() {
    let allowed = scratch("wharf-allowed-");
    let Some(c) = docker_cluster(
        "docker_mount_point_reached_through_an_image_symlink_is_refused",
        allowed.path(),
    ) else {
        return;
    };
    const LINKED: &str = "whfr-e2e-docker-linked";
    docker_import(&c, LINKED, &["sh", "ls", "cat"], |rootfs| {
        std::os::unix::fs::symlink("/dev", rootfs.join("data")).unwrap();
    });
    let mallory = user("whfr-dlink");
    let mine = users_dir(allowed.path(), &mallory);
    mode(&mine, 0o777);
    let before = entries(&mine);
    let bind = format!("{}:/data", mine.display());
    let out = c.wharf_as(
        &mallory,
        &[
            "submit", "--image", LINKED, "--mount", &bind, "--wrap", "ls /dev",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let job = c.wait_done(submitted_id(&out), Duration::from_secs(60));
    assert_eq!(
        entries(&mine),
        before,
        "the job made entries in the user's directory: {job}"
    );
    let reason = job["reason"].as_str().unwrap_or_default();
    assert_eq!(job["state"], "FAILED", "{job}");
    assert!(
        reason.contains("mount point /data passes through a symlink of the image"),
        "{reason}"
    );
}
