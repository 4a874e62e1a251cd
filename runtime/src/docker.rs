//! The Docker backend: the shim drives the Docker engine over its API (bollard) for sites that
//! keep Docker. The job still runs as its user, with only its devices and the site's binds:
//! Wharf builds the container's settings itself, and no job field reaches privileged mode,
//! host PID, capabilities or arbitrary binds. Users never touch the socket.
//!
//! Lifecycle in the shim: open the output files as the user → create (uid:gid, cap-drop ALL,
//! no-new-privileges, init, host network, read-only root, private /tmp, limits, memlock
//! ulimit) → attach (output to the files) → start → wait (time limit and cancel: `docker stop`
//! with the grace period, SIGTERM then SIGKILL) → inspect (exit code, OOM) → remove.
//!
//! Signals a user sends a running task (`wharf cancel --signal`) go through the engine
//! (`docker kill --signal`) to the container's init, which passes them to the program it
//! runs: the program alone, not processes it started, whatever the request reaches in a
//! sandbox of Wharf's own (see [`crate::signals`]).

use std::collections::HashMap;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use bollard::container::LogOutput;
use bollard::models::{ContainerCreateBody, DeviceMapping, HostConfig, ResourcesUlimits};
use bollard::query_parameters::{
    AttachContainerOptions, CreateContainerOptions, InspectContainerOptions, KillContainerOptions,
    RemoveContainerOptions, StopContainerOptions, WaitContainerOptions,
};
use bollard::Docker;
use futures_util::StreamExt;

use crate::error::{ErrorKind, RuntimeError};
use crate::spec::{ContainerSpec, DockerTarget, Outcome};

#[path = "docker_pull.rs"]
mod pull;
pub use pull::{has_image, pull_image, tag_image, EnginePull};

/// The engine settings for `spec`. Pure.
pub fn container_body(spec: &ContainerSpec, target: &DockerTarget) -> ContainerCreateBody {
    let mut groups: Vec<String> = spec
        .groups
        .iter()
        .filter(|&&g| g != spec.gid)
        .map(u32::to_string)
        .collect();
    groups.sort();
    let binds: Vec<String> = spec
        .binds
        .iter()
        .map(|b| {
            format!(
                "{}:{}:{}",
                b.source.display(),
                b.destination,
                if b.read_only { "ro" } else { "rw" }
            )
        })
        .collect();
    let devices: Vec<DeviceMapping> = spec
        .devices
        .iter()
        .map(|d| DeviceMapping {
            path_on_host: Some(d.host_path.display().to_string()),
            path_in_container: Some(d.path.clone()),
            cgroup_permissions: Some("rw".into()),
        })
        .collect();
    let memlock = spec.memlock.map(|m| m as i64).unwrap_or(-1);
    let host = HostConfig {
        network_mode: Some("host".into()),
        cap_drop: Some(vec!["ALL".into()]),
        security_opt: Some(vec!["no-new-privileges".into()]),
        privileged: Some(false),
        init: Some(true),
        readonly_rootfs: Some(!spec.writable),
        tmpfs: Some(HashMap::from([(
            "/tmp".to_string(),
            format!("rw,nosuid,nodev,size={}", spec.tmp_size),
        )])),
        shm_size: Some(spec.shm_size as i64),
        memory: spec.memory.map(|m| m as i64),
        memory_swap: spec.memory.map(|m| m as i64),
        nano_cpus: spec.cpus.map(|c| i64::from(c) * 1_000_000_000),
        cpuset_cpus: (!spec.cpuset.is_empty()).then(|| {
            spec.cpuset
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",")
        }),
        pids_limit: spec.pids,
        ulimits: Some(
            [
                ("memlock", Some(memlock)),
                (
                    "stack",
                    spec.stack
                        .map(|s| if s == u64::MAX { -1 } else { s as i64 }),
                ),
            ]
            .into_iter()
            .filter_map(|(name, v)| {
                v.map(|v| ResourcesUlimits {
                    name: Some(name.into()),
                    soft: Some(v),
                    hard: Some(v),
                })
            })
            .collect(),
        ),
        devices: Some(devices),
        binds: Some(binds),
        group_add: Some(groups),
        ..Default::default()
    };
    ContainerCreateBody {
        image: Some(target.image.clone()),
        cmd: Some(spec.argv.clone()),
        env: Some(spec.env.clone()),
        user: Some(format!("{}:{}", spec.uid, spec.gid)),
        working_dir: Some(spec.cwd.clone()),
        hostname: None, // host network: the node's name
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        host_config: Some(host),
        ..Default::default()
    }
}

/// `spec` with its `tmp_files` as read-only binds the engine can make: each written into
/// `dir` (the job directory, root's alone) and bound at its place in the container's `/tmp`
/// tmpfs, which the engine mounts first. None when a bind replaces `/tmp`: the file would be
/// hidden, and the engine would make its mount point in the bound directory.
pub(crate) fn with_tmp_files(
    dir: &Path,
    spec: &ContainerSpec,
) -> Result<ContainerSpec, RuntimeError> {
    let mut spec = spec.clone();
    let tmp_bound = spec
        .binds
        .iter()
        .any(|b| b.destination.trim_end_matches('/') == "/tmp");
    if spec.tmp_files.is_empty() || tmp_bound {
        return Ok(spec);
    }
    let files = dir.join("files");
    std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
        .recursive(true)
        .create(&files)
        .map_err(|e| RuntimeError::io(files.display(), e))?;
    for (name, contents) in std::mem::take(&mut spec.tmp_files) {
        let at = files.join(&name);
        // Written whole, then made read-only: the engine binds it `ro` as well.
        std::fs::write(&at, contents)
            .and_then(|_| std::fs::set_permissions(&at, std::fs::Permissions::from_mode(0o444)))
            .map_err(|e| RuntimeError::io(at.display(), e))?;
        spec.binds.push(crate::Bind {
            source: at,
            destination: format!("{}/{name}", crate::TMP_FILES_DIR),
            read_only: true,
            beneath: None,
        });
    }
    Ok(spec)
}

/// Runs `f` on a current-thread runtime of its own (the shim and these helpers are called
/// from plain threads).
fn block_on<T>(
    f: impl std::future::Future<Output = Result<T, RuntimeError>>,
) -> Result<T, RuntimeError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| RuntimeError::io("starting the async runtime", e))?
        .block_on(f)
}

/// A client of the engine at `socket`, with a timeout for each request.
fn connect(socket: &std::path::Path, timeout_secs: u64) -> Result<Docker, RuntimeError> {
    Docker::connect_with_unix(
        socket.to_str().unwrap_or_default(),
        timeout_secs,
        bollard::API_DEFAULT_VERSION,
    )
    .map_err(|e| engine("connect", e))
}

/// An engine's error: its answers with a status are about the job (a 404 at create: the image
/// is not there), except server errors, which are left unclassified; no answer at all (the
/// engine cannot be reached, or broke off) is the node's.
fn engine(what: &str, e: bollard::errors::Error) -> RuntimeError {
    use bollard::errors::Error as E;
    let code = match &e {
        E::DockerResponseServerError {
            status_code: 404, ..
        } if what.starts_with("create") => Some(wharf_api::fault::FaultCode::ImageNotFound),
        E::DockerResponseServerError { .. } => None,
        E::HyperResponseError { .. }
        | E::IOError { .. }
        | E::RequestTimeoutError
        | E::SocketNotFoundError(_) => Some(wharf_api::fault::FaultCode::Supervisor),
        _ => None,
    };
    let err = RuntimeError::new(ErrorKind::Unavailable, format!("docker {what}: {e}"));
    match code {
        Some(code) => err.with_code(code),
        None => err,
    }
}

/// Runs `spec` through the engine to the end, writing its output to the given files.
pub(crate) fn supervise(
    jd: &crate::JobDir,
    spec: &ContainerSpec,
    target: &DockerTarget,
    (stdout, stderr): (OwnedFd, OwnedFd),
    cancelled: fn() -> bool,
    out: &mut Outcome,
) -> Result<(), RuntimeError> {
    block_on(run(jd, spec, target, stdout, stderr, cancelled, out))
}

async fn run(
    jd: &crate::JobDir,
    spec: &ContainerSpec,
    target: &DockerTarget,
    stdout: OwnedFd,
    stderr: OwnedFd,
    cancelled: fn() -> bool,
    out: &mut Outcome,
) -> Result<(), RuntimeError> {
    let docker = connect(&target.socket, 120)?;
    let name = spec.id.as_str();
    // A container left by an earlier, killed shim of this job goes first.
    let force = RemoveContainerOptions {
        force: true,
        ..Default::default()
    };
    let _ = docker.remove_container(name, Some(force.clone())).await;
    docker
        .create_container(
            Some(CreateContainerOptions {
                name: Some(name.into()),
                ..Default::default()
            }),
            container_body(spec, target),
        )
        .await
        .map_err(|e| engine(&format!("create (image {:?})", target.image), e))?;
    let result = match check_mount_points(&docker, spec).await {
        Ok(()) => run_created(jd, &docker, spec, stdout, stderr, cancelled, out).await,
        Err(e) => Err(e),
    };
    if let Err(e) = docker.remove_container(name, Some(force)).await {
        eprintln!("wharf shim: removing container {name}: {e}");
    }
    result
}

/// Go's `os.ModeSymlink`, in the engine's path stat.
const GO_MODE_SYMLINK: u32 = 1 << 27;

/// Where each bind would land in the created container's image. The engine's runtime resolves
/// a destination through the image's symlinks (as real root) and makes its `/dev` nodes and
/// symlinks after the binds: an image whose `/data` is a symlink to `/dev` had a bind at
/// `/data` receive them in the bound host directory. As in Wharf's own sandbox
/// (`sandbox/init.rs`): a user's destination may pass through no symlink of the image, and
/// no bind may lead to `/`, or at or under `/proc`, `/sys` or `/dev`. Binds do not nest on
/// this backend when one is a user's (`plan::check_not_nested`), so the image alone decides.
async fn check_mount_points(docker: &Docker, spec: &ContainerSpec) -> Result<(), RuntimeError> {
    let name = spec.id.as_str();
    for b in &spec.binds {
        let mut prefix = String::new();
        for part in b
            .destination
            .split('/')
            .filter(|p| !p.is_empty() && *p != ".")
        {
            prefix.push('/');
            prefix.push_str(part);
            let options = bollard::query_parameters::ContainerArchiveInfoOptionsBuilder::default()
                .path(&prefix)
                .build();
            let stat = match docker.get_container_archive_info(name, Some(options)).await {
                Ok(stat) => stat,
                // Missing: the engine makes it, in the container's own layer.
                Err(bollard::errors::Error::DockerResponseServerError {
                    status_code: 404, ..
                }) => break,
                Err(e) => return Err(engine(&format!("looking at {prefix} in the image"), e)),
            };
            if stat.file_mode & GO_MODE_SYMLINK == 0 {
                continue;
            }
            if b.beneath.is_some() {
                return Err(RuntimeError::new(
                    ErrorKind::InvalidInput,
                    format!(
                        "mount point {} passes through a symlink of the image ({prefix} -> {}): \
                         a --mount destination must be reached through no symlink; give the \
                         path it points to",
                        b.destination, stat.link_target
                    ),
                ));
            }
            if let Some(dir) = crate::sandbox::plan::reserved(&stat.link_target) {
                return Err(RuntimeError::new(
                    ErrorKind::InvalidInput,
                    format!(
                        "mount point {} leads to {}, at or under {dir}, which the sandbox makes \
                         itself: no bind may land there (choose another destination)",
                        b.destination, stat.link_target
                    ),
                ));
            }
        }
    }
    Ok(())
}

async fn run_created(
    jd: &crate::JobDir,
    docker: &Docker,
    spec: &ContainerSpec,
    stdout: OwnedFd,
    stderr: OwnedFd,
    cancelled: fn() -> bool,
    out: &mut Outcome,
) -> Result<(), RuntimeError> {
    let name = spec.id.as_str();
    let pump = pump_output(
        docker,
        name,
        std::fs::File::from(stdout),
        std::fs::File::from(stderr),
    )
    .await?;
    if cancelled() {
        out.cancelled = true;
        return Ok(());
    }
    docker
        .start_container(name, None)
        .await
        .map_err(|e| engine("start", e))?;
    let started = Instant::now();
    out.started_ms = Some(crate::now_ms());
    if let Some(ms) = out.started_ms {
        let _ = crate::JobDir::write_private(&jd.started(), ms.to_string().as_bytes());
    }
    // Looked for each second: the wait wakes every 50 ms.
    let mut limit = crate::jobdir::Deadline::new(started, spec.time_limit, Duration::from_secs(1));
    // From here the task takes signals.
    if let Err(e) = crate::signals::open(jd) {
        eprintln!("wharf shim: this task takes no signals: {e}");
    }
    let mut next_look = Instant::now();
    let mut wait = docker.wait_container(name, None::<WaitContainerOptions>);
    loop {
        tokio::select! {
            _ = wait.next() => break,
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
        // A limit changed since the launch (the agent writes it) counts from the start too.
        if !out.timed_out {
            limit.refresh(jd);
        }
        let deadline = limit.at();
        let stopping = out.cancelled || out.timed_out;
        // Read before the requests are (see `shim::wait_init`): requests written before the
        // cancel go first.
        let cancel = !stopping && cancelled();
        // Requests are looked for once a second, as the limit is (nothing wakes this wait
        // for them, and a look is a read of the request directory), and once more before a
        // cancel closes their directory.
        if !stopping && (cancel || Instant::now() >= next_look) {
            next_look = Instant::now() + Duration::from_secs(1);
            for req in crate::signals::take(jd) {
                deliver(docker, name, req).await;
            }
        }
        if cancel {
            out.cancelled = true;
        } else if !stopping && deadline.is_some_and(|d| Instant::now() >= d) {
            out.timed_out = true;
        }
        if !stopping && (out.cancelled || out.timed_out) {
            // A stopping job's program takes only the stop's signals from here on.
            crate::signals::close(jd);
            // SIGTERM now, SIGKILL after the grace period, done by the engine.
            let (d, n, t) = (docker.clone(), name.to_string(), spec.grace_secs as i32);
            tokio::spawn(async move {
                let _ = d
                    .stop_container(
                        &n,
                        Some(StopContainerOptions {
                            t: Some(t),
                            signal: None,
                        }),
                    )
                    .await;
            });
        }
    }
    crate::signals::close(jd);
    let _ = tokio::time::timeout(Duration::from_secs(5), pump).await;
    let info = docker
        .inspect_container(name, None::<InspectContainerOptions>)
        .await
        .map_err(|e| engine("inspect", e))?;
    let state = info.state.unwrap_or_default();
    out.oom = state.oom_killed.unwrap_or(false);
    let code = state.exit_code.unwrap_or(-1) as i32;
    // With an init, a job ended by a signal exits 128+signal.
    if code > 128 && (out.cancelled || out.timed_out || out.oom) {
        out.signal = Some(code - 128);
    } else {
        out.exit_code = Some(code);
    }
    Ok(())
}

/// Sends a user's signal to container `name`'s program through the engine (see the module
/// doc); a failure is said on the shim's error output, and the job goes on.
async fn deliver(docker: &Docker, name: &str, req: crate::signals::Request) {
    let Some(sig) = req.to_send() else {
        return;
    };
    let kill = KillContainerOptions {
        signal: sig.as_str().to_string(),
    };
    // Bounded: the wait this runs in also watches for a cancel and the time limit.
    let sent = tokio::time::timeout(
        Duration::from_secs(5),
        docker.kill_container(name, Some(kill)),
    );
    match sent.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => eprintln!("wharf shim: docker kill --signal {sig}: {e}"),
        Err(_) => eprintln!("wharf shim: docker kill --signal {sig}: no answer in 5 s"),
    }
}

/// What the shim asks of the engine's attach: the live stream, and not the engine's log
/// (`logs`). The engine joins the stream before it answers the attach, and the shim attaches
/// before it starts the container, so the stream alone carries every byte. The log would be
/// read after that answer, concurrently with the start: whatever the job wrote before the
/// engine finished reading it would reach the files twice (once replayed, once streamed).
fn attach_options() -> AttachContainerOptions {
    AttachContainerOptions {
        stream: true,
        stdout: true,
        stderr: true,
        logs: false,
        ..Default::default()
    }
}

/// Attaches to container `name` and copies what it writes from now on into `stdout` and
/// `stderr`, each byte once, until its output ends. The engine has attached when this
/// returns; the task ends with the container's output.
async fn pump_output(
    docker: &Docker,
    name: &str,
    mut stdout: std::fs::File,
    mut stderr: std::fs::File,
) -> Result<tokio::task::JoinHandle<()>, RuntimeError> {
    let mut output = docker
        .attach_container(name, Some(attach_options()))
        .await
        .map_err(|e| engine("attach", e))?
        .output;
    Ok(tokio::spawn(async move {
        while let Some(Ok(chunk)) = output.next().await {
            let _ = match chunk {
                LogOutput::StdErr { message } => stderr.write_all(&message),
                LogOutput::StdOut { message } | LogOutput::Console { message } => {
                    stdout.write_all(&message)
                }
                LogOutput::StdIn { .. } => Ok(()),
            };
        }
    }))
}

/// Removes the engine's container `name` (killing it if it runs). Missing is fine.
pub fn remove(target: &DockerTarget, name: &str) -> Result<(), RuntimeError> {
    block_on(async {
        let docker = connect(&target.socket, 30)?;
        match docker
            .remove_container(
                name,
                Some(RemoveContainerOptions {
                    force: true,
                    ..Default::default()
                }),
            )
            .await
        {
            Ok(())
            | Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(()),
            Err(e) => Err(engine("remove", e)),
        }
    })
}

/// The engine's image tags (`name:tag`), for the node's report.
pub fn list_images(socket: &std::path::Path) -> Result<Vec<String>, RuntimeError> {
    block_on(async {
        let docker = connect(socket, 10)?;
        let images = docker
            .list_images(None::<bollard::query_parameters::ListImagesOptions>)
            .await
            .map_err(|e| engine("list images", e))?;
        let mut tags: Vec<String> = images
            .into_iter()
            .flat_map(|i| i.repo_tags)
            .flat_map(|t| [t.strip_suffix(":latest").map(str::to_string), Some(t)])
            .flatten()
            .collect();
        tags.sort();
        tags.dedup();
        Ok(tags)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tmp_files_become_read_only_binds_unless_a_bind_replaces_tmp() {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = crate::conformance::template("d", Path::new("/"), 1000, 1000);
        spec.tmp_files = vec![("hostfile".into(), "n1 slots=1\n".into())];
        let out = with_tmp_files(dir.path(), &spec).unwrap();
        assert!(out.tmp_files.is_empty());
        let at = dir.path().join("files/hostfile");
        assert_eq!(
            out.binds,
            [crate::Bind {
                source: at.clone(),
                destination: "/tmp/wharf/hostfile".into(),
                read_only: true,
                beneath: None,
            }]
        );
        assert_eq!(std::fs::read_to_string(&at).unwrap(), "n1 slots=1\n");
        let mode = std::fs::metadata(&at).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o444);
        // Written again for a requeued job's next run.
        assert_eq!(with_tmp_files(dir.path(), &spec).unwrap(), out);
        // A bind of /tmp hides it: nothing bound inside the bound directory.
        spec.binds = out.binds.clone();
        spec.binds[0].destination = "/tmp/".into();
        let kept = with_tmp_files(dir.path(), &spec).unwrap();
        assert_eq!(kept.binds, spec.binds);
    }

    #[test]
    fn settings_are_locked_down() {
        let mut spec = crate::conformance::template("d", std::path::Path::new("/"), 1000, 1000);
        spec.groups = vec![1000, 44];
        spec.argv = vec!["/bin/true".into()];
        let body = container_body(
            &spec,
            &DockerTarget {
                socket: "/s".into(),
                image: "img".into(),
            },
        );
        let h = body.host_config.unwrap();
        assert_eq!(body.user.as_deref(), Some("1000:1000"));
        assert_eq!(h.cap_drop, Some(vec!["ALL".to_string()]));
        assert_eq!(h.security_opt, Some(vec!["no-new-privileges".to_string()]));
        assert_eq!(
            (h.privileged, h.init, h.readonly_rootfs),
            (Some(false), Some(true), Some(true))
        );
        assert_eq!(h.network_mode.as_deref(), Some("host"));
        assert_eq!(h.pid_mode, None);
        assert_eq!(h.cap_add, None);
        assert_eq!(h.group_add, Some(vec!["44".to_string()]));
        assert_eq!(h.ulimits.unwrap()[0].hard, Some(-1));
    }

    /// The engine and an image of `sh` and `sleep` (made with `examples/mkrootfs.sh` and
    /// `docker import`), or `None` after saying why (a failure under WHARF_TEST_STRICT=1).
    fn engine_image(test: &str, name: &str) -> Option<tempfile::TempDir> {
        let up = nix::unistd::geteuid().is_root()
            && std::process::Command::new("docker")
                .arg("info")
                .output()
                .is_ok_and(|o| o.status.success());
        if !crate::test_can_run(
            test,
            (!up).then_some("needs root and the Docker engine (docker info)"),
        ) {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let rootfs = dir.path().join("rootfs");
        let mkrootfs =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/mkrootfs.sh");
        let made = std::process::Command::new(mkrootfs)
            .arg(&rootfs)
            .args(["sh", "sleep"])
            .status()
            .unwrap();
        assert!(made.success(), "mkrootfs.sh");
        let import = format!(
            "tar -C '{}' -c . | docker import - '{name}'",
            rootfs.display()
        );
        let ok = std::process::Command::new("sh")
            .args(["-c", &import])
            .status()
            .unwrap();
        assert!(ok.success(), "docker import {name}");
        Some(dir)
    }

    /// The attach carries only what the job writes after it, never the engine's log: a job's
    /// first lines written while the engine would still be reading that log must not reach the
    /// files a second time. Shown deterministically by attaching after the job has written.
    #[test]
    fn the_attach_never_replays_what_the_job_wrote_before_it() {
        let test = "the_attach_never_replays_what_the_job_wrote_before_it";
        let image = "wharf-runtime-attach:latest";
        let Some(dir) = engine_image(test, image) else {
            return;
        };
        let name = format!("wharf-attach-{}", std::process::id());
        let (out, err) = (dir.path().join("out"), dir.path().join("err"));
        block_on(async {
            let docker = connect(std::path::Path::new("/var/run/docker.sock"), 60)?;
            let body = ContainerCreateBody {
                image: Some(image.into()),
                cmd: Some(
                    [
                        "/bin/sh",
                        "-c",
                        "echo early; echo early-err >&2; sleep 5; echo late; echo late-err >&2",
                    ]
                    .map(String::from)
                    .to_vec(),
                ),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                ..Default::default()
            };
            let create = CreateContainerOptions {
                name: Some(name.clone()),
                ..Default::default()
            };
            docker
                .create_container(Some(create), body)
                .await
                .map_err(|e| engine("create", e))?;
            docker
                .start_container(&name, None)
                .await
                .map_err(|e| engine("start", e))?;
            // Wait until the engine has logged the early lines.
            let since = Instant::now();
            loop {
                let logs: Vec<_> = docker
                    .logs(
                        &name,
                        Some(bollard::query_parameters::LogsOptions {
                            stdout: true,
                            stderr: true,
                            ..Default::default()
                        }),
                    )
                    .collect()
                    .await;
                if logs.len() >= 2 {
                    break;
                }
                assert!(
                    since.elapsed() < Duration::from_secs(4),
                    "the job's first lines never reached the engine's log"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let pump = pump_output(
                &docker,
                &name,
                std::fs::File::create(&out).unwrap(),
                std::fs::File::create(&err).unwrap(),
            )
            .await?;
            let _ = docker
                .wait_container(&name, None::<WaitContainerOptions>)
                .next()
                .await;
            let _ = tokio::time::timeout(Duration::from_secs(10), pump).await;
            let force = RemoveContainerOptions {
                force: true,
                ..Default::default()
            };
            let _ = docker.remove_container(&name, Some(force)).await;
            Ok(())
        })
        .unwrap();
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "late\n");
        assert_eq!(std::fs::read_to_string(&err).unwrap(), "late-err\n");
    }
}
