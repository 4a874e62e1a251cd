//! Turning a launch order into a container spec for this node.

use std::path::{Path, PathBuf};

use wharf_api::fault::{FaultCode, LaunchFault};
use wharf_api::wire::LaunchOrder;
use wharf_runtime::ContainerSpec;

use wharf_api::node::{GpuInfo, GpuUnit};

use crate::discover::Machine;
use crate::AgentConfig;

/// What tells a job and the tools inside it which GPUs it has: CUDA numbers whole GPUs from
/// 0 (the job sees only its own device nodes) and takes MIG instances by UUID only
/// (`MIG-...`); container runtimes and NVML name them by UUID where known (NVML's numbering
/// is not the device minor's); Slurm's names carry the node's own ids (a MIG instance's is
/// its unit id).
fn gpu_env(units: &[GpuUnit]) -> Vec<(String, String)> {
    let join = |f: &dyn Fn(usize, &GpuUnit) -> String| {
        units
            .iter()
            .enumerate()
            .map(|(i, u)| f(i, u))
            .collect::<Vec<_>>()
            .join(",")
    };
    let uuid = |u: &GpuUnit| match &u.mig {
        Some(m) if m.uuid.starts_with("MIG-") => Some(m.uuid.clone()),
        Some(m) => Some(format!("MIG-{}", m.uuid)),
        None => u.gpu.uuid.clone(),
    };
    let mig = units.iter().any(|u| u.mig.is_some());
    let by_uuid = units.iter().all(|u| uuid(u).is_some());
    let visible = if units.is_empty() {
        "void".to_string()
    } else if by_uuid {
        join(&|_, u| uuid(u).unwrap_or_default())
    } else {
        join(&|_, u| u.gpu.index.to_string())
    };
    let cuda = if mig && by_uuid {
        visible.clone()
    } else {
        join(&|i, _| i.to_string())
    };
    let mut env = vec![
        ("CUDA_VISIBLE_DEVICES".to_string(), cuda),
        ("NVIDIA_VISIBLE_DEVICES".to_string(), visible),
    ];
    if !units.is_empty() {
        env.extend([
            ("SLURM_JOB_GPUS".to_string(), join(&|_, u| u.id.to_string())),
            ("SLURM_GPUS_ON_NODE".to_string(), units.len().to_string()),
            (
                "GPU_DEVICE_ORDINAL".to_string(),
                join(&|i, _| i.to_string()),
            ),
        ]);
    }
    env
}

/// A launch order that cannot run here: in words for the user, and whose fault it is.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct LaunchError {
    /// The step that failed (its kind says whose fault it is).
    pub code: FaultCode,
    /// What happened.
    pub message: String,
}

impl LaunchError {
    /// A failure of step `code`.
    pub fn new(code: FaultCode, message: impl Into<String>) -> Self {
        LaunchError {
            code,
            message: message.into(),
        }
    }

    /// The classified fault.
    pub fn fault(&self) -> LaunchFault {
        LaunchFault::new(self.code)
    }
}

impl From<wharf_runtime::RuntimeError> for LaunchError {
    fn from(e: wharf_runtime::RuntimeError) -> Self {
        LaunchError::new(e.fault().code, e.message)
    }
}

/// Whose fault an image store error is: the registry's answers and a missing or malformed
/// image are the job's, an unreachable registry passes, the store's own disk is the node's.
pub fn image_fault(e: &wharf_images::ImageError) -> FaultCode {
    use wharf_images::ErrorKind as K;
    match e.kind {
        K::NotFound => FaultCode::ImageNotFound,
        K::InvalidInput => FaultCode::ImageInvalid,
        K::Refused => FaultCode::ImageDenied,
        K::Unreachable => FaultCode::RegistryUnreachable,
        K::PermissionDenied | K::Unavailable if e.message.contains("No space left on device") => {
            FaultCode::DiskFull
        }
        K::PermissionDenied | K::Unavailable => FaultCode::ImageStore,
    }
}

/// Whether the controller knew the job's user by name (not only by uid): a user it knows and
/// this node does not means the node's user database is broken. A user known to neither runs
/// with bare ids, as before.
fn known_by_name(owner: &wharf_api::Owner) -> bool {
    owner.user != owner.uid.to_string()
}

/// What task `local` of its node gets of the node's share of the job: its CPUs (the node's
/// CPU indices split evenly among the tasks), its GPUs (its own `gpus_per_task` when the job
/// asked for them, else all the node's), and its memory (the node's split evenly: each task
/// is a sandbox, with a cgroup, of its own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskShare {
    /// CPU indices (into the node's CPU list).
    pub cpu_ids: Vec<u32>,
    /// GPU ids.
    pub gpu_ids: Vec<u32>,
    /// CPUs it may use.
    pub cpus: u32,
    /// Memory limit, bytes.
    pub memory: u64,
}

/// Whether `order` runs the job's command once, as rank 0 alone (`JobSpec::once`, as sbatch
/// runs a batch script); never a step's order, whose command runs in each of its tasks.
fn runs_once(order: &LaunchOrder) -> bool {
    order.spec.once && order.rendezvous.step.is_none()
}

/// Task `local`'s share of what `order` holds on `machine`. Tasks with GPUs of their own
/// take their CPUs from their GPU's NUMA node first (`--gpu-bind closest`, per task as the
/// scheduler does per job).
pub fn task_share(order: &LaunchOrder, local: u32, machine: &Machine) -> TaskShare {
    let spec = &order.spec;
    // A command that runs once (as sbatch's batch step) has all the job holds on its node,
    // as Slurm's batch step has: its other ranks run nothing.
    if runs_once(order) {
        return TaskShare {
            cpu_ids: order.cpu_ids.clone(),
            gpu_ids: order.gpu_ids.clone(),
            cpus: (order.cpu_ids.len() as u32).max(1),
            memory: spec.resources.memory,
        };
    }
    let per_node = spec.tasks_per_node.max(1);
    let each_cpu = (order.cpu_ids.len() as u32 / per_node).max(1);
    let gpus_of = |task| crate::env::share(&order.gpu_ids, per_node, task, spec.gpus_per_task);
    let cpu_ids = match spec.gpus_per_task {
        Some(_) if order.cpu_ids.len() >= (each_cpu * per_node) as usize => {
            let near = |task| {
                let gpu = *gpus_of(task).first()?;
                machine.unit(gpu)?.gpu.numa_node
            };
            closest_cpus(
                &order.cpu_ids,
                &machine.cpu_numa,
                per_node,
                each_cpu,
                local,
                near,
            )
        }
        _ => crate::env::share(&order.cpu_ids, per_node, local, Some(each_cpu)),
    };
    TaskShare {
        cpu_ids,
        gpu_ids: gpus_of(local),
        cpus: spec.cpus_per_task(),
        memory: spec.resources.memory / u64::from(per_node),
    }
}

/// The `each` CPU indices (of `ids`, indices into the node's CPU list, whose NUMA nodes
/// `numa` gives) task `local` gets: first every task with a NUMA node of its own (`near`)
/// takes what it can there, in task order, lowest index first; then every task takes the
/// rest it needs from what is left, in task order. Disjoint, and the same whichever task
/// works it out.
fn closest_cpus(
    ids: &[u32],
    numa: &[u32],
    per_node: u32,
    each: u32,
    local: u32,
    near: impl Fn(u32) -> Option<u32>,
) -> Vec<u32> {
    let each = each as usize;
    let mut pool: Vec<u32> = ids.to_vec();
    let mut got: Vec<Vec<u32>> = vec![Vec::new(); per_node as usize];
    for (task, mine) in got.iter_mut().enumerate() {
        let Some(home) = near(task as u32) else {
            continue;
        };
        let on_home = |i: &u32| numa.get(*i as usize) == Some(&home);
        mine.extend(pool.iter().copied().filter(on_home).take(each));
        pool.retain(|i| !mine.contains(i));
    }
    for mine in got.iter_mut() {
        let more = each.saturating_sub(mine.len());
        mine.extend(pool.drain(..more.min(pool.len())));
        mine.sort_unstable();
    }
    got.swap_remove(local.min(per_node - 1) as usize)
}

/// The node's CPU ids of CPU indices `ids` (into the node's CPU list).
fn host_cpus(ids: &[u32], machine: &Machine) -> Vec<u32> {
    ids.iter()
        .filter_map(|&i| machine.cpus.get(i as usize).copied())
        .collect()
}

/// The CPU set of task `local` of a step whose tasks have `each` of the order's CPUs
/// (`wharf step -c`) instead of the node's CPUs of the job split evenly: the order keeps
/// naming all of them, which the job's cgroup is written with.
pub fn step_cpuset(order: &LaunchOrder, local: u32, each: u32, machine: &Machine) -> Vec<u32> {
    let per_node = order.spec.tasks_per_node.max(1);
    let ids = crate::env::share(&order.cpu_ids, per_node, local, Some(each));
    host_cpus(&ids, machine)
}

/// Builds the container spec for task `local` of `order` on `machine` (CPU index → CPU id,
/// GPUs by minor).
pub fn container_spec(
    cfg: &AgentConfig,
    images: &wharf_images::ImageStore,
    order: &LaunchOrder,
    local: u32,
    machine: &Machine,
) -> Result<ContainerSpec, LaunchError> {
    let share = task_share(order, local, machine);
    let units: Vec<GpuUnit> = share
        .gpu_ids
        .iter()
        .map(|&id| {
            machine.unit(id).ok_or_else(|| {
                LaunchError::new(
                    FaultCode::Device,
                    format!(
                        "GPU unit {id} was allocated but node {} has no such MIG instance",
                        cfg.node_name
                    ),
                )
            })
        })
        .collect::<Result<_, _>>()?;
    // The GPUs themselves (a MIG instance's parent once), for the CDI spec.
    let mut gpus: Vec<GpuInfo> = Vec::new();
    for u in &units {
        if !gpus.iter().any(|g| g.index == u.gpu.index) {
            gpus.push(u.gpu.clone());
        }
    }
    let spec = &order.spec;
    let task = crate::env::Task {
        per_node: spec.tasks_per_node.max(1),
        local,
        // SLURM_CPUS_PER_TASK is the job's -c, also for a command that runs once on all of
        // the node's share (`srun -c $SLURM_CPUS_PER_TASK` must still fit).
        cpus: if runs_once(order) {
            spec.cpus_per_task()
        } else {
            share.cpus
        },
    };
    let user = match nix::unistd::User::from_uid(order.owner.uid.into()) {
        Ok(Some(u)) => Some(u),
        Ok(None) if !known_by_name(&order.owner) => None,
        Ok(None) => {
            return Err(LaunchError::new(
                FaultCode::User,
                format!(
                    "user {} (uid {}) is unknown on node {}: its user database lacks them",
                    order.owner.user, order.owner.uid, cfg.node_name
                ),
            ))
        }
        Err(e) => {
            return Err(LaunchError::new(
                FaultCode::User,
                format!(
                    "looking up uid {} on node {}: {e}",
                    order.owner.uid, cfg.node_name
                ),
            ))
        }
    };
    let groups = match &user {
        Some(u) => {
            let name = std::ffi::CString::new(u.name.as_str())
                .map_err(|_| LaunchError::new(FaultCode::User, "bad user name"))?;
            nix::unistd::getgrouplist(&name, order.owner.gid.into())
                .map(|g| g.into_iter().map(|g| g.as_raw()).collect())
                .unwrap_or_else(|_| vec![order.owner.gid])
        }
        None => vec![order.owner.gid],
    };
    let Root {
        path: rootfs,
        partition: rootfs_partition,
        digest: image_digest,
    } = resolve_image(cfg, images, order, &groups)?;
    let home = user
        .as_ref()
        .map(|u| u.dir.display().to_string())
        .unwrap_or_else(|| "/".into());
    // The working directory must exist inside the root; an image rarely has the user's, and
    // the sandbox mounts its own /tmp, /dev, /proc and /sys over the host's.
    let top = spec
        .workdir
        .trim_start_matches('/')
        .split('/')
        .next()
        .unwrap_or("");
    let shadowed = wharf_runtime::SANDBOX_MOUNT_POINTS.contains(&top);
    // An image gets the directory made in its job layer; the host root must already have it.
    let visible = !shadowed && (spec.image != "host" || Path::new(&spec.workdir).is_dir());
    let cwd = if visible {
        spec.workdir.clone()
    } else {
        "/".into()
    };
    let identity = user.as_ref().map(|u| wharf_runtime::Identity {
        user: u.name.clone(),
        home: u.dir.display().to_string(),
        groups: groups
            .iter()
            .filter_map(|&g| {
                nix::unistd::Group::from_gid(g.into())
                    .ok()
                    .flatten()
                    .map(|gr| (g, gr.name))
            })
            .collect(),
    });
    // The node's CDI spec: driver libraries, tools and extra nodes for exactly these GPUs.
    let cdi = if share.gpu_ids.is_empty() {
        None
    } else {
        let edits = crate::cdi::gpu_edits(&cfg.cdi_dirs, &gpus)
            .map_err(|why| LaunchError::new(FaultCode::Device, why))?;
        match edits {
            Some(edits) => Some(edits),
            // No CDI spec: the driver files found on the node, at the same paths.
            None => Some(crate::cdi::GpuEdits {
                binds: crate::cdi::discovered_driver_files(
                    &cfg.driver_lib_dirs,
                    &cfg.driver_bin_dirs,
                ),
                ..Default::default()
            }),
        }
    };
    let mut binds: Vec<wharf_runtime::Bind> = cfg
        .binds
        .iter()
        .filter(|b| b.source.exists())
        .cloned()
        .collect();
    // First, so that a shared path or a user's bind over /usr/local hides it rather than
    // needing its mount point inside the bound directory.
    if let Some(b) = step_binary_bind(cfg, &rootfs) {
        binds.insert(0, b);
    }
    for m in &spec.mounts {
        binds.push(user_bind(cfg, m, order.owner.uid, &groups)?);
    }
    if let Some(edits) = &cdi {
        for b in &edits.binds {
            if !b.source.exists() {
                return Err(LaunchError::new(
                    FaultCode::Device,
                    format!(
                        "the node's CDI spec names {}, which is missing",
                        b.source.display()
                    ),
                ));
            }
        }
        binds.extend(edits.binds.iter().cloned());
    }
    if matches!(cfg.backend, crate::BackendKind::Docker(_)) && spec.remap_root {
        return Err(LaunchError::new(
            FaultCode::Unsupported,
            format!(
                "node {} runs jobs with Docker, which cannot remap root",
                cfg.node_name
            ),
        ));
    }
    let cpuset = host_cpus(&share.cpu_ids, machine);
    let mut env: Vec<(String, String)> = vec![
        (
            "PATH".into(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        ),
        ("HOME".into(), home),
        ("USER".into(), order.owner.user.clone()),
        ("LOGNAME".into(), order.owner.user.clone()),
    ];
    // The node's defaults (NCCL_*, FI_*, ...), then the job's own, which win.
    env.extend(cfg.job_env.iter().cloned());
    env.retain(|(k, _)| !spec.env.contains_key(k));
    env.extend(spec.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    let mut devices = gpu_devices(&cfg.dev_root, &units)?;
    if let Some(edits) = &cdi {
        for (host, path) in &edits.device_nodes {
            // Wharf's own choice of GPU nodes stands; the spec adds the rest (MIG caps, ...).
            if !devices.iter().any(|d| &d.path == path) {
                let node = wharf_runtime::DeviceNode::from_host(host, path).map_err(|e| {
                    LaunchError::new(
                        FaultCode::Device,
                        format!("CDI device {}: {e}", host.display()),
                    )
                })?;
                devices.push(node);
            }
        }
    }
    // A gang gets the node's RDMA devices wherever it has them; a job that asked for RDMA
    // fails at once where it has none.
    if spec.rdma {
        devices.extend(rdma_devices(cfg)?);
    } else if order.rendezvous.nodes.len() > 1 {
        devices.extend(rdma_devices(cfg).unwrap_or_default());
    }
    preflight_memlock(cfg, spec.memlock)?;
    let host_gpus: Vec<String> = share.gpu_ids.iter().map(u32::to_string).collect();
    // Where it was submitted from, whatever `--chdir` says (a job stored before that was
    // kept has its working directory).
    let submit_dir = Some(&spec.submit_dir)
        .filter(|d| !d.is_empty())
        .unwrap_or(&spec.workdir);
    env.extend([
        ("WHARF_JOB_ID".into(), order.id.to_string()),
        ("WHARF_JOB_NAME".into(), spec.name.clone()),
        ("WHARF_NODE".into(), cfg.node_name.clone()),
        ("WHARF_CPUS_ON_NODE".into(), spec.resources.cpus.to_string()),
        ("WHARF_SUBMIT_DIR".into(), submit_dir.clone()),
        ("SLURM_JOB_ID".into(), order.id.to_string()),
        ("SLURM_JOB_NAME".into(), spec.name.clone()),
        ("SLURM_CPUS_ON_NODE".into(), spec.resources.cpus.to_string()),
        (
            "SLURM_JOB_CPUS_PER_NODE".into(),
            spec.resources.cpus.to_string(),
        ),
        // MiB, as Slurm gives it.
        (
            "SLURM_MEM_PER_NODE".into(),
            (spec.resources.memory >> 20).to_string(),
        ),
        ("SLURM_SUBMIT_DIR".into(), submit_dir.clone()),
        ("SLURMD_NODENAME".into(), cfg.node_name.clone()),
        ("WHARF_GPUS".into(), host_gpus.join(",")),
        // Where `wharf step` reaches this node's agent.
        ("WHARF_STEP_SOCKET".into(), crate::step::socket_env(cfg)),
    ]);
    env.extend(gpu_env(&units));
    // A step's task is told its GPUs as the step's too, as Slurm's are.
    if order.rendezvous.step.is_some() && !units.is_empty() {
        let ids: Vec<String> = units.iter().map(|u| u.id.to_string()).collect();
        env.push(("SLURM_STEP_GPUS".into(), ids.join(",")));
    }
    // The rendezvous is this agent's to say: a value the order also carries (a step's, for
    // agents that predate its place in the rendezvous) is replaced, never listed twice.
    let mut rendezvous = crate::env::rendezvous(&order.rendezvous, task, order.restarts);
    // A command that runs once is no member of a world of the job's tasks (the others run
    // nothing): torch's world sizes would have a `torch.distributed` program wait for peers
    // that never come, where without them it stops at once saying so. Its rank (0) stays, so
    // `[ "$RANK" = 0 ] || exit 0` still runs it, and Slurm's variables (`SLURM_NTASKS`, ...)
    // as the batch step has them; its steps get their own.
    let once = runs_once(order);
    let world = |k: &str| k == "WORLD_SIZE" || k == "LOCAL_WORLD_SIZE";
    // The agent's rendezvous wins; a once-run command keeps no world size of anyone's.
    env.retain(|(k, _)| !(rendezvous.iter().any(|(r, _)| r == k) || once && world(k)));
    if once {
        rendezvous.retain(|(k, _)| !world(k));
    }
    env.extend(rendezvous);
    // The hostfile, read-only in the job's private /tmp. Only Wharf's own name: Open MPI's
    // default-hostfile variable would cap every mpirun in the job at one slot per node.
    let mut tmp_files = vec![];
    if let Some(text) = crate::env::hostfile(&order.rendezvous, task.per_node) {
        env.push((
            "WHARF_HOSTFILE".into(),
            format!("{}/hostfile", wharf_runtime::TMP_FILES_DIR),
        ));
        tmp_files.push(("hostfile".to_string(), text));
    }
    if let Some(a) = spec.array {
        let (job, task) = (a.job_id.to_string(), a.task_id.to_string());
        env.extend([
            ("WHARF_ARRAY_JOB_ID".into(), job.clone()),
            ("WHARF_ARRAY_TASK_ID".into(), task.clone()),
            ("SLURM_ARRAY_JOB_ID".into(), job),
            ("SLURM_ARRAY_TASK_ID".into(), task),
        ]);
        if !a.shape.is_unknown() {
            let s = a.shape;
            for (name, v) in [
                ("COUNT", s.count),
                ("MIN", s.min),
                ("MAX", s.max),
                ("STEP", s.step),
            ] {
                env.push((format!("WHARF_ARRAY_TASK_{name}"), v.to_string()));
                env.push((format!("SLURM_ARRAY_TASK_{name}"), v.to_string()));
            }
        }
    }
    // The partition, account and QoS it runs under (the controller names the ones it chose
    // when the job gave none).
    for (name, value) in [
        ("PARTITION", &spec.partition),
        ("ACCOUNT", &spec.account),
        ("QOS", &spec.qos),
    ] {
        if let Some(v) = value {
            env.push((format!("WHARF_JOB_{name}"), v.clone()));
            env.push((format!("SLURM_JOB_{name}"), v.clone()));
        }
    }
    // Rank 0 writes the job's files; every other rank its own, beside them.
    let rank = u32::try_from(task.rank(order.rendezvous.node_rank)).unwrap_or(u32::MAX);
    // The names' `%N` is the job's first node (a step's names have theirs already), `%n`
    // this node's index.
    let rdv = &order.rendezvous;
    let place = wharf_api::job::FilePlace {
        user: Some(&order.owner.user),
        first_node: match &rdv.step {
            Some(step) => step.job_nodes.first().map(String::as_str),
            None => rdv.nodes.first().map(|p| p.name.as_str()),
        }
        .or(Some(&cfg.node_name)),
        node_index: Some(rdv.node_rank),
    };
    // A job whose command runs once (as sbatch runs a script) runs it as rank 0 alone: its
    // other ranks hold their share for the job's steps, run nothing and write no file. The
    // first of them on each other node waits to be stopped, so that the node's part of the
    // job runs as long as the job (a controller that says it stops it when rank 0 ends);
    // the rest end.
    let idle = runs_once(order) && rank != 0;
    let hold = idle && local == 0 && order.stops_holders;
    let (stdout, stderr) = if idle {
        (PathBuf::from("/dev/null"), PathBuf::from("/dev/null"))
    } else {
        let out = PathBuf::from(spec.rank_output_path(order.id, rank, &place));
        let err = (spec.rank_error_path(order.id, rank, &place))
            .map_or_else(|| out.clone(), PathBuf::from);
        (out, err)
    };
    Ok(ContainerSpec {
        id: container_id(order.id, local),
        rootfs,
        argv: spec.argv.clone(),
        env: with_cdi_env(env, cdi.as_ref()),
        cwd,
        uid: order.owner.uid,
        gid: order.owner.gid,
        groups,
        root_host_id: cfg.root_host_id,
        hostname: cfg.node_name.clone(),
        memory: Some(share.memory),
        cpus: Some(share.cpus),
        cpuset,
        pids: cfg.pids_limit,
        tmp_size: cfg.tmp_size,
        shm_size: cfg.shm_size,
        stdout,
        stderr,
        // A requeued job's next run adds to what the last one wrote.
        append_output: order.restarts > 0,
        // A step's launch captures the streams its caller takes (`step::launch`).
        capture_stdout: false,
        capture_stderr: false,
        capture_stdin: false,
        time_limit: Some(spec.time_limit),
        grace_secs: cfg.grace_secs,
        cgroup_parent: cfg.cgroup_parent.clone(),
        job_cgroup: job_cgroup(cfg, order, machine),
        devices,
        memlock: cfg.memlock,
        binds,
        tmp_files,
        identity,
        rootfs_partition,
        image_digest,
        stack: cfg.stack,
        remap_root: spec.remap_root,
        writable: spec.writable,
        idle,
        hold,
        docker: match &cfg.backend {
            crate::BackendKind::Docker(socket) => Some(wharf_runtime::DockerTarget {
                socket: socket.clone(),
                image: crate::engine::engine_run_image(socket, &cfg.registry, &spec.image),
            }),
            crate::BackendKind::Oci => None,
        },
    })
}

/// The job's cgroup on this node, which every task of the job and of its steps has its own
/// cgroup under: the job's memory on the node, its CPUs and the node's task limit hold for
/// them all together (a step shares the job's `--mem` with the batch command). The same for
/// every task and step of the job (from the job's order, not the task's share). `None` for
/// the Docker engine, whose containers have cgroups of its own.
fn job_cgroup(
    cfg: &AgentConfig,
    order: &LaunchOrder,
    machine: &Machine,
) -> Option<wharf_runtime::JobCgroupSpec> {
    if cfg.backend != crate::BackendKind::Oci {
        return None;
    }
    Some(wharf_runtime::JobCgroupSpec {
        name: format!("wharf-{}", order.id),
        memory: Some(order.spec.resources.memory),
        cpuset: order
            .cpu_ids
            .iter()
            .filter_map(|&i| machine.cpus.get(i as usize).copied())
            .collect(),
        pids: cfg.pids_limit,
    })
}

/// The agent's own binary, bound read-only at [`crate::step::STEP_BINARY_PATH`] in a job whose
/// root is an image, so `wharf step` works there as on the host. `None` for the host's root
/// (which has the node's `wharf` where the admin installed it, and in which the sandbox makes
/// no mount point), for the Docker engine (the step socket knows callers by the cgroups of
/// Wharf's own sandbox only), and where the binary is gone from its path (replaced while the
/// agent runs: nothing is bound rather than another file).
fn step_binary_bind(cfg: &AgentConfig, rootfs: &Path) -> Option<wharf_runtime::Bind> {
    if rootfs == Path::new("/") || cfg.backend != crate::BackendKind::Oci {
        return None;
    }
    if !cfg.shim_exe.is_file() {
        tracing::warn!(exe = %cfg.shim_exe.display(), "the agent's binary is gone; `wharf step` is not bound into image jobs");
        return None;
    }
    // The node's own bind, by path: the sandbox makes its mount point in the job's layer and
    // binds it read-only, nosuid and nodev like every node bind.
    Some(wharf_runtime::Bind {
        source: cfg.shim_exe.clone(),
        destination: crate::step::STEP_BINARY_PATH.into(),
        read_only: true,
        beneath: None,
    })
}

/// Pins the image of the store that `spec` runs on (none for the host, a SIF file or the
/// Docker engine): it is not evicted or removed while pinned.
///
/// Errors: the image went away since it was resolved (evicted or removed meanwhile).
pub fn pin_image(
    cfg: &AgentConfig,
    spec: &ContainerSpec,
) -> Result<Option<wharf_images::Pin>, wharf_images::ImageError> {
    if cfg.backend != crate::BackendKind::Oci
        || spec.rootfs_partition.is_some()
        || spec.rootfs == Path::new("/")
    {
        return Ok(None);
    }
    wharf_images::Pin::rootfs(&spec.rootfs).map(Some)
}

/// A job's root as [`resolve_image`] found it.
struct Root {
    /// A directory, or a SIF file.
    path: PathBuf,
    /// A SIF file's squashfs partition: offset and size.
    partition: Option<(u64, u64)>,
    /// An image of the store's digest.
    digest: Option<String>,
}

impl Root {
    fn at(path: PathBuf) -> Root {
        Root {
            path,
            partition: None,
            digest: None,
        }
    }
}

/// The job's root: the host's `/`, an image in the store (with its digest), or a SIF file (an absolute path
/// ending in `.sif`, which the user must be able to read). The agent reads it as root, so it
/// refuses early, with a clear reason, a file the user could not open (symlinks resolved
/// first: what counts is the directories above the target); the shim then opens it as the
/// user, and only that descriptor is mounted.
fn resolve_image(
    cfg: &AgentConfig,
    images: &wharf_images::ImageStore,
    order: &LaunchOrder,
    groups: &[u32],
) -> Result<Root, LaunchError> {
    let image = &order.spec.image;
    if let crate::BackendKind::Docker(_) = cfg.backend {
        if image == "host" || image.starts_with('/') {
            return Err(LaunchError::new(
                FaultCode::Unsupported,
                format!(
                    "node {} runs jobs with Docker, which cannot run image {image:?}",
                    cfg.node_name
                ),
            ));
        }
        return Ok(Root::at(PathBuf::from("/")));
    }
    if image == "host" {
        return Ok(Root::at(PathBuf::from("/")));
    }
    if image.starts_with('/') && image.ends_with(".sif") {
        let path = PathBuf::from(image);
        let real = std::fs::canonicalize(&path)
            .ok()
            .filter(|real| readable_by(real, order.owner.uid, groups));
        let Some(real) = real else {
            return Err(LaunchError::new(
                FaultCode::ImageInvalid,
                // One answer for both: which paths exist where the user may not look is not
                // theirs to learn.
                format!(
                    "{image}: no such file, or not readable by {} on node {}",
                    order.owner.user, cfg.node_name
                ),
            ));
        };
        // What was checked is parsed (the shim opens the user's path again, as the user). As
        // root, so never waiting on it: a FIFO swapped in since would hold this launch thread,
        // and with it every launch and stop on the node.
        let part = wharf_images::sif::primary_partition_no_follow(&real).map_err(|e| {
            let code = match image_fault(&e) {
                // The user's file, not the node's store.
                FaultCode::ImageStore => FaultCode::ImageInvalid,
                code => code,
            };
            LaunchError::new(
                code,
                e.to_string()
                    .replacen(&real.display().to_string(), image, 1),
            )
        })?;
        return Ok(Root {
            partition: Some((part.offset, part.size)),
            ..Root::at(path)
        });
    }
    // An imported image of that name first; else the registry image pulled for it.
    let info = images
        .get(image)
        .or_else(|e| match image.parse::<wharf_images::ImageRef>() {
            Ok(r) if e.kind == wharf_images::ErrorKind::NotFound => images.pulled(&r).ok_or(e),
            _ => Err(e),
        });
    let info = info.map_err(|e| {
        LaunchError::new(
            image_fault(&e),
            format!("image {image:?} on node {}: {e}", cfg.node_name),
        )
    })?;
    Ok(Root {
        digest: Some(info.digest),
        ..Root::at(info.rootfs)
    })
}

/// A bind the user asked for (`SOURCE:DEST[:ro]`): the source, symlinks resolved, must lie
/// under one of the node's `allowed_mounts`, and the user must be able to reach it (a bind
/// must not let them past a directory they could not enter). This is the early check, for a
/// clear error; the path may change after it. What is bound is what the shim opens as the
/// user, beneath that allowed directory and through no symlink (`Bind::beneath`).
fn user_bind(
    cfg: &AgentConfig,
    entry: &str,
    uid: u32,
    groups: &[u32],
) -> Result<wharf_runtime::Bind, LaunchError> {
    let m = wharf_api::job::parse_mount(entry, false)
        .map_err(|why| LaunchError::new(FaultCode::Mount, format!("mount {why}")))?;
    let (src, dst, read_only) = (m.source.as_str(), m.destination.as_str(), m.read_only);
    let real = std::fs::canonicalize(src).map_err(|e| {
        LaunchError::new(
            FaultCode::Mount,
            format!("mount {entry:?}: {src} on node {}: {e}", cfg.node_name),
        )
    })?;
    // The innermost allowed directory holding it: the shim resolves the rest beneath it.
    let allowed = cfg
        .allowed_mounts
        .iter()
        .filter_map(|a| std::fs::canonicalize(a).ok())
        .filter(|a| real.starts_with(a))
        .max_by_key(|a| a.as_os_str().len());
    let Some(beneath) = allowed else {
        let list: Vec<String> = cfg
            .allowed_mounts
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        return Err(LaunchError::new(
            FaultCode::Mount,
            format!(
            "mount {entry:?}: {} is not under a path this node allows (agent.allowed_mounts: {})",
            real.display(),
            if list.is_empty() {
                "none".to_string()
            } else {
                list.join(", ")
            }
        ),
        ));
    };
    if !reachable_by(&real, uid, groups) {
        return Err(LaunchError::new(
            FaultCode::Mount,
            format!(
                "mount {entry:?}: you cannot reach {} on node {}",
                real.display(),
                cfg.node_name
            ),
        ));
    }
    Ok(wharf_runtime::Bind {
        source: real,
        destination: dst.to_string(),
        read_only,
        beneath: Some(beneath),
    })
}

/// Whether `uid` may search every directory above `path` (and `path` itself if a directory).
fn reachable_by(path: &Path, uid: u32, groups: &[u32]) -> bool {
    use std::os::unix::fs::MetadataExt;
    if uid == 0 {
        return true;
    }
    path.ancestors().all(|d| {
        std::fs::metadata(d).is_ok_and(|m| {
            if !m.is_dir() {
                return true;
            }
            let mode = m.mode();
            if m.uid() == uid {
                mode & 0o100 != 0
            } else if groups.contains(&m.gid()) {
                mode & 0o010 != 0
            } else {
                mode & 0o001 != 0
            }
        })
    })
}

/// Whether `uid` (with `groups`) could open `path`, a path without symlinks, for reading: the
/// file's permission bits and every directory above it searchable.
fn readable_by(path: &Path, uid: u32, groups: &[u32]) -> bool {
    use std::os::unix::fs::MetadataExt;
    let allowed = |m: &std::fs::Metadata, bits: u32| {
        let mode = m.mode();
        if uid == 0 {
            return true;
        }
        if m.uid() == uid {
            mode & (bits << 6) != 0
        } else if groups.contains(&m.gid()) {
            mode & (bits << 3) != 0
        } else {
            mode & bits != 0
        }
    };
    let dirs_ok = path
        .ancestors()
        .skip(1)
        .all(|d| std::fs::metadata(d).is_ok_and(|m| allowed(&m, 0o1)));
    dirs_ok && std::fs::metadata(path).is_ok_and(|m| m.is_file() && allowed(&m, 0o4))
}

/// Every RDMA device of the node (`DEV/infiniband/*`: uverbs, rdma_cm, ...). A job that asks
/// for RDMA on a node without any fails at once, saying so: the node's fault when it is said
/// to have RDMA (feature `rdma`), else the job's (it should ask for `--constraint rdma`).
fn rdma_devices(cfg: &AgentConfig) -> Result<Vec<wharf_runtime::DeviceNode>, LaunchError> {
    let dir = cfg.dev_root.join("infiniband");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .map(|e| {
            e.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    let devices: Vec<wharf_runtime::DeviceNode> = names
        .iter()
        .filter_map(|n| {
            wharf_runtime::DeviceNode::from_host(&dir.join(n), &format!("/dev/infiniband/{n}")).ok()
        })
        .collect();
    if devices.is_empty() {
        let code = if cfg.features.iter().any(|f| f == RDMA_FEATURE) {
            FaultCode::Rdma
        } else {
            FaultCode::Unsupported
        };
        return Err(LaunchError::new(
            code,
            format!(
                "the job needs RDMA but node {} has no RDMA devices ({} is missing or empty)",
                cfg.node_name,
                dir.display()
            ),
        ));
    }
    Ok(devices)
}

/// The most locked memory this node can give a job: `agent.memlock`, and no more than its
/// shims can give a sandbox (see [`wharf_runtime::memlock_ceiling`]).
pub fn node_memlock(cfg: &AgentConfig) -> u64 {
    cfg.memlock
        .unwrap_or(u64::MAX)
        .min(wharf_runtime::memlock_ceiling())
}

fn preflight_memlock(cfg: &AgentConfig, need: Option<u64>) -> Result<(), LaunchError> {
    let Some(need) = need else { return Ok(()) };
    let can = node_memlock(cfg);
    if need <= can {
        return Ok(());
    }
    let show = |v: u64| {
        if v == u64::MAX {
            "unlimited".to_string()
        } else {
            wharf_api::resources::format_memory(v)
        }
    };
    // Within what the node's admin allows, only the agent's missing privilege stands in the
    // way: the node's fault. Beyond it, the job asks for more than this node ever gives.
    let code = if need <= cfg.memlock.unwrap_or(u64::MAX) {
        FaultCode::Memlock
    } else {
        FaultCode::Unsupported
    };
    Err(LaunchError::new(
        code,
        format!(
        "the job needs {} of locked memory (memlock) but node {} can give {}: raise agent.memlock, or run the agent with CAP_SYS_RESOURCE (as a systemd service it has it)",
        show(need),
        cfg.node_name,
        show(can)
    )))
}

/// Sets `name` to `value` in a sandbox's environment (`NAME=VALUE` entries), in place of
/// any value it had.
pub(crate) fn set_env(env: &mut Vec<String>, name: &str, value: &str) {
    env.retain(|e| e.split_once('=').is_none_or(|(k, _)| k != name));
    env.push(format!("{name}={value}"));
}

/// The job's environment as `NAME=value`, plus the CDI spec's variables that Wharf does not
/// set itself (Wharf's GPU numbering wins).
fn with_cdi_env(env: Vec<(String, String)>, cdi: Option<&crate::cdi::GpuEdits>) -> Vec<String> {
    let mut out: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    for e in cdi.map(|c| c.env.as_slice()).unwrap_or_default() {
        let key = e.split('=').next().unwrap_or("");
        if !env.iter().any(|(k, _)| k == key) {
            out.push(e.clone());
        }
    }
    out
}

/// The feature that says a node has RDMA: a job that needs RDMA and finds none on such a node
/// finds the node at fault.
pub const RDMA_FEATURE: &str = "rdma";

/// Control devices a GPU job also needs, when the node has them.
const GPU_CONTROL_DEVICES: [&str; 4] = [
    "nvidiactl",
    "nvidia-uvm",
    "nvidia-uvm-tools",
    "nvidia-modeset",
];

/// The device nodes for the allocated GPU units: `/dev/nvidiaN` for each whole GPU; for a
/// MIG instance its GPU's `/dev/nvidiaN` and its own capability devices
/// (`/dev/nvidia-caps/nvidia-capK`: no other instance's); plus the control devices present
/// on the node. A missing node fails the launch with the reason.
pub fn gpu_devices(
    dev_root: &Path,
    units: &[GpuUnit],
) -> Result<Vec<wharf_runtime::DeviceNode>, LaunchError> {
    if units.is_empty() {
        return Ok(vec![]);
    }
    let mut out: Vec<wharf_runtime::DeviceNode> = Vec::new();
    let mut add = |host: PathBuf, path: String, what: &dyn Fn() -> String| {
        if out.iter().any(|d| d.path == path) {
            return Ok::<(), LaunchError>(());
        }
        let node = wharf_runtime::DeviceNode::from_host(&host, &path).map_err(|e| {
            LaunchError::new(
                FaultCode::Device,
                format!("{} was allocated but {}: {e}", what(), host.display()),
            )
        })?;
        out.push(node);
        Ok(())
    };
    for u in units {
        let minor = u.gpu.index;
        let what = || match &u.mig {
            Some(m) => format!("MIG instance {} ({}) of GPU {minor}", m.uuid, m.profile),
            None => format!("GPU {minor}"),
        };
        add(
            dev_root.join(format!("nvidia{minor}")),
            format!("/dev/nvidia{minor}"),
            &what,
        )?;
        let Some(mig) = &u.mig else { continue };
        if mig.caps.is_empty() {
            return Err(LaunchError::new(
                FaultCode::Device,
                format!(
                    "{} was allocated but the driver lists no capability devices for it",
                    what()
                ),
            ));
        }
        for cap in &mig.caps {
            add(
                dev_root.join(format!("nvidia-caps/nvidia-cap{cap}")),
                format!("/dev/nvidia-caps/nvidia-cap{cap}"),
                &what,
            )?;
        }
    }
    for name in GPU_CONTROL_DEVICES {
        let host = dev_root.join(name);
        if host.exists() {
            let node = wharf_runtime::DeviceNode::from_host(&host, &format!("/dev/{name}"))
                .map_err(|e| {
                    LaunchError::new(FaultCode::Device, format!("{}: {e}", host.display()))
                })?;
            out.push(node);
        }
    }
    Ok(out)
}

/// Where job `id` lives on this node: its first task's directory (see [`task_dir`]).
pub fn job_dir(state_dir: &Path, id: u64) -> wharf_runtime::JobDir {
    task_dir(state_dir, id, 0)
}

/// The name of task `local`'s directory of job `id`: `ID` for the first (as for a job with
/// one task per node), `ID.L` for the others.
pub fn task_dir_name(id: u64, local: u32) -> String {
    if local == 0 {
        id.to_string()
    } else {
        format!("{id}.{local}")
    }
}

/// The job and task a directory name under `jobs` stands for ([`task_dir_name`]'s inverse).
pub fn parse_task_dir_name(name: &str) -> Option<(u64, u32)> {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let (id, local) = match name.split_once('.') {
        None => (name, 0),
        // Only the form task_dir_name writes: no task 0, no leading zeros.
        Some((id, local)) => {
            let n: u32 = local.parse().ok().filter(|_| digits(local))?;
            (id, Some(n).filter(|&n| n > 0 && n.to_string() == local)?)
        }
    };
    digits(id).then(|| id.parse().ok().map(|id| (id, local)))?
}

/// The mark of job `id` prepared here and waiting for its release (a gang's first phase):
/// `ID.ready` beside the task directories, a file, so that nothing takes it for a task.
pub fn ready_mark(state_dir: &Path, id: u64) -> PathBuf {
    state_dir.join("jobs").join(format!("{id}.ready"))
}

/// The job a name under `jobs` marks as prepared ([`ready_mark`]'s inverse).
pub fn parse_ready_name(name: &str) -> Option<u64> {
    let id = name.strip_suffix(".ready")?;
    (!id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
        .then(|| id.parse().ok())
        .flatten()
}

/// Where task `local` of job `id` lives on this node, each task in a sandbox of its own.
pub fn task_dir(state_dir: &Path, id: u64, local: u32) -> wharf_runtime::JobDir {
    wharf_runtime::JobDir::new(state_dir.join("jobs").join(task_dir_name(id, local)))
}

/// The container (and cgroup) name of task `local` of job `id`.
pub fn container_id(id: u64, local: u32) -> String {
    format!("wharf-{}", task_dir_name(id, local))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use wharf_api::fault::FaultKind;

    /// The controller refuses at submit what the sandbox refuses to build: one list, kept
    /// in two crates (the scheduler's API does not depend on the runtime).
    #[test]
    fn submit_and_sandbox_reserve_the_same_destinations() {
        assert_eq!(
            wharf_api::job::RESERVED_DESTINATIONS,
            wharf_runtime::RESERVED_DESTINATIONS
        );
        // Every directory the sandbox mounts its own filesystem on is reserved but /tmp, in
        // which nothing is made (a bind may replace it).
        for top in wharf_runtime::SANDBOX_MOUNT_POINTS {
            let reserved = wharf_api::job::reserved_destination(&format!("/{top}/x"));
            assert_eq!(reserved.is_none(), top == "tmp", "/{top}");
        }
    }

    pub(crate) fn cfg(dev_root: &Path) -> AgentConfig {
        AgentConfig {
            controller: wharf_client::Endpoint::parse("/nonexistent/wharf.sock"),
            controller_tls: None,
            token: String::new(),
            node_name: "n1".into(),
            state_dir: dev_root.join("state"),
            image_store: dev_root.join("images"),
            registry: Default::default(),
            cache_quota: None,
            shared_cache: None,
            shim_exe: "/nonexistent/wharf".into(),
            root_host_id: 0,
            grace_secs: 1,
            tmp_size: 1 << 20,
            shm_size: 1 << 20,
            pids_limit: None,
            cgroup_parent: "wharf-test".into(),
            reserved_memory: 0,
            dev_root: dev_root.to_path_buf(),
            nvml: false,
            sample_interval: std::time::Duration::ZERO,
            backend: crate::BackendKind::Oci,
            memlock: None,
            stack: None,
            binds: vec![],
            allowed_mounts: vec![],
            cdi_dirs: vec![],
            driver_lib_dirs: vec![],
            driver_bin_dirs: vec![],
            features: vec![],
            fabric_interface: None,
            job_env: vec![],
        }
    }

    #[test]
    fn image_store_errors_are_classified_by_who_said_what() {
        use wharf_images::{ErrorKind as K, ImageError};
        let code = |kind, message: &str| image_fault(&ImageError::new(kind, message));
        // The registry's answers: MANIFEST_UNKNOWN is a 404, DENIED a 401/403.
        assert_eq!(
            code(K::NotFound, "HTTP 404 MANIFEST_UNKNOWN"),
            FaultCode::ImageNotFound
        );
        assert_eq!(code(K::Refused, "HTTP 403 DENIED"), FaultCode::ImageDenied);
        assert_eq!(
            code(K::InvalidInput, "bad manifest"),
            FaultCode::ImageInvalid
        );
        assert_eq!(
            code(K::Unreachable, "cannot reach the registry"),
            FaultCode::RegistryUnreachable
        );
        // The node's own store.
        assert_eq!(
            code(K::PermissionDenied, "open: EACCES"),
            FaultCode::ImageStore
        );
        assert_eq!(code(K::Unavailable, "EIO"), FaultCode::ImageStore);
        assert_eq!(
            code(
                K::Unavailable,
                "writing blob: No space left on device (os error 28)"
            ),
            FaultCode::DiskFull
        );
        for (c, kind) in [
            (FaultCode::ImageNotFound, FaultKind::Job),
            (FaultCode::ImageDenied, FaultKind::Job),
            (FaultCode::RegistryUnreachable, FaultKind::Transient),
            (FaultCode::ImageStore, FaultKind::Node),
        ] {
            assert_eq!(c.kind(), kind, "{c}");
        }
    }

    #[test]
    fn an_image_job_gets_the_agents_binary_read_only_and_the_host_root_does_not() {
        let dev = tempfile::tempdir().unwrap();
        let mut cfg = cfg(dev.path());
        let image = Path::new("/var/lib/wharf/images/x/rootfs");
        // The binary must be there to be bound.
        assert_eq!(step_binary_bind(&cfg, image), None);
        let exe = dev.path().join("wharf");
        std::fs::write(&exe, b"").unwrap();
        cfg.shim_exe = exe.clone();
        let b = step_binary_bind(&cfg, image).expect("an image job gets the binary");
        assert_eq!(b.source, exe);
        assert_eq!(b.destination, "/usr/local/bin/wharf");
        assert!(b.read_only);
        assert_eq!(b.beneath, None, "bound by path, as the node's own");
        assert_eq!(step_binary_bind(&cfg, Path::new("/")), None);
        cfg.backend = crate::BackendKind::Docker("/run/docker.sock".into());
        assert_eq!(step_binary_bind(&cfg, image), None);
    }

    /// A machine of four CPUs, ids 10 to 13.
    pub(crate) fn four_cpus() -> Machine {
        Machine {
            cpus: vec![10, 11, 12, 13],
            gpus: vec![],
            cpu_numa: vec![],
        }
    }

    /// A device root, and the order for job `id` on the host's root, as root, holding CPUs
    /// 1 and 3 of [`four_cpus`] and `memory` there for `tasks` tasks.
    pub(crate) fn host_order(id: u64, memory: u64, tasks: u32) -> (tempfile::TempDir, LaunchOrder) {
        let mut spec = wharf_api::JobRequest {
            command: Some(vec!["true".into()]),
            image: Some("host".into()),
            ..Default::default()
        }
        .resolve("/", &wharf_api::JobDefaults::default())
        .unwrap();
        spec.resources.memory = memory;
        spec.tasks_per_node = tasks;
        let order = LaunchOrder {
            id,
            owner: wharf_api::Owner {
                uid: 0,
                gid: 0,
                user: "root".into(),
            },
            spec,
            cpu_ids: vec![1, 3],
            gpu_ids: vec![],
            restarts: 0,
            rendezvous: Default::default(),
            registry_auth: None,
            hold: false,
            stops_holders: false,
        };
        (tempfile::tempdir().unwrap(), order)
    }

    #[test]
    fn every_task_of_a_job_has_its_cgroup_under_the_jobs_which_holds_the_jobs_limits() {
        let (dev, order) = host_order(9, 1 << 30, 2);
        let mut cfg = cfg(dev.path());
        cfg.pids_limit = Some(512);
        let images = wharf_images::ImageStore::open(dev.path().join("images")).unwrap();
        let machine = four_cpus();
        let job = wharf_runtime::JobCgroupSpec {
            name: "wharf-9".into(),
            memory: Some(1 << 30),
            cpuset: vec![11, 13],
            pids: Some(512),
        };
        for (local, leaf) in [(0, "wharf-9"), (1, "wharf-9.1")] {
            let task = container_spec(&cfg, &images, &order, local, &machine).unwrap();
            // The task's own share in its leaf, the job's whole under it.
            assert_eq!(task.memory, Some(1 << 29));
            assert_eq!(task.cpuset.len(), 1);
            assert_eq!(task.job_cgroup.as_ref(), Some(&job));
            assert_eq!(task.cgroup_path(), format!("/wharf-test/wharf-9/{leaf}"));
            assert_eq!(
                task.job_cgroup_path().as_deref(),
                Some("/wharf-test/wharf-9")
            );
        }
        // Run once: on the first node task 0 runs the command and task 1 ends at once; on
        // another node task 0 holds the node for the job and task 1 ends at once.
        let mut once = order.clone();
        once.spec.once = true;
        let kinds = |o: &LaunchOrder| -> Vec<(bool, bool)> {
            (0..2)
                .map(|l| container_spec(&cfg, &images, o, l, &machine).unwrap())
                .map(|t| (t.idle, t.hold))
                .collect()
        };
        once.stops_holders = true;
        assert_eq!(kinds(&once), [(false, false), (true, false)]);
        once.rendezvous.node_rank = 1;
        assert_eq!(kinds(&once), [(true, true), (true, false)]);
        // A controller that does not say it stops the holders: nothing waits to be stopped.
        once.stops_holders = false;
        assert_eq!(kinds(&once), [(true, false), (true, false)]);
        assert_eq!(kinds(&order), [(false, false), (false, false)]);
        // Submitted from one directory to run in another: SLURM_SUBMIT_DIR is the first.
        let mut moved = order.clone();
        moved.spec.submit_dir = "/home/ann".into();
        let env = container_spec(&cfg, &images, &moved, 0, &machine)
            .unwrap()
            .env;
        assert!(
            env.iter().any(|e| e == "SLURM_SUBMIT_DIR=/home/ann"),
            "{env:?}"
        );
        assert!(
            env.iter().any(|e| e == "WHARF_SUBMIT_DIR=/home/ann"),
            "{env:?}"
        );
        let env = container_spec(&cfg, &images, &order, 0, &machine)
            .unwrap()
            .env;
        assert!(env.iter().any(|e| e == "SLURM_SUBMIT_DIR=/"), "{env:?}");
        cfg.backend = crate::BackendKind::Docker("/run/docker.sock".into());
        assert_eq!(job_cgroup(&cfg, &order, &machine), None);
    }

    #[test]
    fn a_missing_rdma_device_is_the_nodes_fault_only_where_it_claims_rdma() {
        let dev = tempfile::tempdir().unwrap();
        let mut cfg = cfg(dev.path());
        let e = rdma_devices(&cfg).unwrap_err();
        assert_eq!(e.code, FaultCode::Unsupported, "{e}");
        assert_eq!(e.fault().kind, FaultKind::Job);
        cfg.features = vec![RDMA_FEATURE.into()];
        let e = rdma_devices(&cfg).unwrap_err();
        assert_eq!(e.code, FaultCode::Rdma, "{e}");
        assert_eq!(e.fault().kind, FaultKind::Node);
    }

    #[test]
    fn memlock_beyond_agent_memlock_is_the_jobs_within_it_the_nodes() {
        let dev = tempfile::tempdir().unwrap();
        let mut cfg = cfg(dev.path());
        cfg.memlock = Some(64 << 20);
        assert!(preflight_memlock(&cfg, Some(1 << 20)).is_ok());
        let e = preflight_memlock(&cfg, Some(u64::MAX)).unwrap_err();
        assert_eq!(e.code, FaultCode::Unsupported, "{e}");
        // Within agent.memlock but beyond what this process's shims can give (only when it
        // cannot raise its own limit).
        let ceiling = wharf_runtime::memlock_ceiling();
        if ceiling < u64::MAX {
            cfg.memlock = None;
            let e = preflight_memlock(&cfg, Some(ceiling + 1)).unwrap_err();
            assert_eq!(e.code, FaultCode::Memlock, "{e}");
        }
    }

    fn whole(minor: u32) -> GpuUnit {
        GpuInfo::minor(minor).units().remove(0)
    }

    /// Makes character device `name` under `dir` (its parents too); `false` without root.
    fn fake_device(dir: &Path, name: &str, major: u64, minor: u64) -> bool {
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        nix::sys::stat::mknod(
            &path,
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(major, minor),
        )
        .is_ok()
    }

    #[test]
    fn a_job_given_a_mig_instance_gets_its_gpu_and_only_its_own_capability_devices() {
        let test = "a_job_given_a_mig_instance_gets_its_gpu_and_only_its_own_capability_devices";
        if !nix::unistd::geteuid().is_root() {
            assert!(
                std::env::var("WHARF_TEST_STRICT").as_deref() != Ok("1"),
                "{test} needs root"
            );
            eprintln!("SKIPPED {test}: mknod needs root");
            return;
        }
        let dev = tempfile::tempdir().unwrap();
        for (name, major, minor) in [
            ("nvidia3", 195, 3),
            ("nvidiactl", 195, 255),
            ("nvidia-caps/nvidia-cap21", 237, 21),
            ("nvidia-caps/nvidia-cap22", 237, 22),
            ("nvidia-caps/nvidia-cap30", 237, 30),
            ("nvidia-caps/nvidia-cap31", 237, 31),
        ] {
            assert!(fake_device(dev.path(), name, major, minor), "mknod {name}");
        }
        let mig = |uuid: &str, profile: &str, caps: Vec<u32>| wharf_api::node::MigInfo {
            uuid: uuid.into(),
            profile: profile.into(),
            memory: None,
            caps,
        };
        let machine = Machine {
            cpus: vec![0, 1],
            gpus: vec![GpuInfo {
                uuid: Some("GPU-parent".into()),
                model: Some("NVIDIA H100 80GB HBM3".into()),
                mig: vec![
                    mig("MIG-aaaa", "1g.10gb", vec![21, 22]),
                    mig("MIG-bbbb", "1g.10gb", vec![30, 31]),
                ],
                ..GpuInfo::minor(3)
            }],
            cpu_numa: vec![],
        };
        let cfg = cfg(dev.path());
        let images = wharf_images::ImageStore::open(dev.path().join("images")).unwrap();
        let second = wharf_api::node::mig_unit_id(3, 1);
        let spec = wharf_api::JobRequest {
            command: Some(vec!["true".into()]),
            image: Some("host".into()),
            gpus: Some(1),
            gpu_type: Some("1g.10gb".into()),
            ..Default::default()
        }
        .resolve("/", &wharf_api::JobDefaults::default())
        .unwrap();
        let order = LaunchOrder {
            id: 9,
            owner: wharf_api::Owner {
                uid: 0,
                gid: 0,
                user: "root".into(),
            },
            spec,
            cpu_ids: vec![0],
            gpu_ids: vec![second],
            restarts: 0,
            rendezvous: Default::default(),
            registry_auth: None,
            hold: false,
            stops_holders: false,
        };
        let spec = container_spec(&cfg, &images, &order, 0, &machine).unwrap();
        // The GPU's own node, the second instance's two capabilities, the control device:
        // the device cgroup allows exactly these, so the first instance's stay shut.
        let devices: Vec<(&str, i64, i64)> = spec
            .devices
            .iter()
            .map(|d| (d.path.as_str(), d.major, d.minor))
            .collect();
        assert_eq!(
            devices,
            [
                ("/dev/nvidia3", 195, 3),
                ("/dev/nvidia-caps/nvidia-cap30", 237, 30),
                ("/dev/nvidia-caps/nvidia-cap31", 237, 31),
                ("/dev/nvidiactl", 195, 255),
            ]
        );
        let env: std::collections::BTreeMap<&str, &str> =
            spec.env.iter().filter_map(|e| e.split_once('=')).collect();
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], "MIG-bbbb");
        assert_eq!(env["NVIDIA_VISIBLE_DEVICES"], "MIG-bbbb");
        assert_eq!(env["SLURM_JOB_GPUS"], second.to_string());
        // The parent as a whole is no unit of this node; nor is an instance it lacks.
        let mut whole = order.clone();
        whole.gpu_ids = vec![wharf_api::node::mig_unit_id(3, 5)];
        let e = container_spec(&cfg, &images, &whole, 0, &machine).unwrap_err();
        assert_eq!(e.code, FaultCode::Device, "{e}");
        // An instance whose capability device is missing: the node's fault, named.
        std::fs::remove_file(dev.path().join("nvidia-caps/nvidia-cap31")).unwrap();
        let e = container_spec(&cfg, &images, &order, 0, &machine).unwrap_err();
        assert_eq!(e.code, FaultCode::Device, "{e}");
        assert!(
            e.message
                .contains("MIG instance MIG-bbbb (1g.10gb) of GPU 3"),
            "{e}"
        );
    }

    #[test]
    fn a_missing_gpu_device_is_the_nodes_fault() {
        let dev = tempfile::tempdir().unwrap();
        let e = gpu_devices(dev.path(), &[whole(0)]).unwrap_err();
        assert_eq!(e.code, FaultCode::Device, "{e}");
        assert!(e.message.contains("GPU 0 was allocated but"), "{e}");
        assert!(gpu_devices(dev.path(), &[]).unwrap().is_empty());
    }

    #[test]
    fn a_user_the_controller_knows_by_name_must_be_known_here() {
        let owner = |uid: u32, user: &str| wharf_api::Owner {
            uid,
            gid: uid,
            user: user.into(),
        };
        assert!(known_by_name(&owner(4242, "ann")));
        assert!(!known_by_name(&owner(4242, "4242")));
    }

    #[test]
    fn runtime_errors_keep_their_code_and_default_to_the_jobs() {
        let e = wharf_runtime::RuntimeError::new(wharf_runtime::ErrorKind::Unavailable, "x")
            .with_code(FaultCode::Cgroup);
        assert_eq!(LaunchError::from(e).code, FaultCode::Cgroup);
        let e = wharf_runtime::RuntimeError::new(wharf_runtime::ErrorKind::NotFound, "y");
        let e = LaunchError::from(e);
        assert_eq!((e.code, e.message.as_str()), (FaultCode::Other, "y"));
    }

    #[test]
    fn a_nodes_cpus_gpus_and_memory_are_split_among_its_tasks() {
        let order = |per_task_gpus: Option<u32>, gpus: Option<u32>| {
            let spec = wharf_api::JobRequest {
                command: Some(vec!["true".into()]),
                ntasks_per_node: Some(2),
                cpus: Some(2),
                memory: Some(8 << 30),
                gpus,
                gpus_per_task: per_task_gpus,
                ..Default::default()
            }
            .resolve("/", &wharf_api::JobDefaults::default())
            .unwrap();
            LaunchOrder {
                id: 3,
                owner: wharf_api::Owner {
                    uid: 1000,
                    gid: 1000,
                    user: "ann".into(),
                },
                spec,
                cpu_ids: vec![4, 5, 6, 7],
                gpu_ids: vec![1, 3],
                restarts: 0,
                rendezvous: Default::default(),
                registry_auth: None,
                hold: false,
                stops_holders: false,
            }
        };
        let own = order(Some(1), None);
        let flat = Machine::default();
        let shares: Vec<TaskShare> = (0..2).map(|l| task_share(&own, l, &flat)).collect();
        assert_eq!(shares[0].cpu_ids, [4, 5]);
        assert_eq!(shares[1].cpu_ids, [6, 7]);
        assert_eq!(
            (shares[0].gpu_ids.as_slice(), shares[1].gpu_ids.as_slice()),
            (&[1][..], &[3][..])
        );
        for s in &shares {
            assert_eq!((s.cpus, s.memory), (2, 4 << 30));
        }
        // Without --gpus-per-task both tasks see the node's GPUs of the job.
        let shared = order(None, Some(2));
        assert_eq!(task_share(&shared, 1, &flat).gpu_ids, [1, 3]);
        // A command that runs once has all the job holds on the node, as Slurm's batch step.
        let mut once = order(Some(1), None);
        once.spec.once = true;
        let batch = task_share(&once, 0, &flat);
        assert_eq!(
            (batch.cpu_ids, batch.gpu_ids, batch.cpus, batch.memory),
            (vec![4, 5, 6, 7], vec![1, 3], 4, 8 << 30)
        );
        // A step with --cpus-per-task 1 in the same allocation (its order names the job's
        // four CPUs, and 1 × 2 tasks as its CPUs): one CPU each, told so.
        let mut step = order(None, None);
        step.spec.resources.cpus = 2;
        let cpus: Vec<u32> = (0..8).map(|c| 100 + c).collect();
        let machine = Machine {
            cpus,
            ..Default::default()
        };
        assert_eq!(step_cpuset(&step, 0, 1, &machine), [104]);
        assert_eq!(step_cpuset(&step, 1, 1, &machine), [105]);
        assert_eq!(task_share(&step, 1, &flat).cpus, 1);
        // On a node whose CPUs 4-5 sit on NUMA node 0 and 6-7 on node 1, with GPU 1 on node
        // 1 and GPU 3 on node 0, each task's CPUs are its own GPU's.
        let gpu = |index, numa| wharf_api::node::GpuInfo {
            numa_node: Some(numa),
            ..wharf_api::node::GpuInfo::minor(index)
        };
        let numa = Machine {
            cpus: (0..8).collect(),
            gpus: vec![gpu(1, 1), gpu(3, 0)],
            cpu_numa: vec![0, 0, 0, 0, 0, 0, 1, 1],
        };
        let shares: Vec<TaskShare> = (0..2).map(|l| task_share(&own, l, &numa)).collect();
        assert_eq!(shares[0].gpu_ids, [1]);
        assert_eq!(shares[0].cpu_ids, [6, 7]);
        assert_eq!(shares[1].cpu_ids, [4, 5]);
        // A first task whose GPU says no NUMA node takes what the others leave, not the
        // second task's home.
        let homeless = Machine {
            gpus: vec![wharf_api::node::GpuInfo::minor(1), gpu(3, 1)],
            cpu_numa: vec![0, 0, 0, 0, 1, 1, 0, 0],
            ..numa
        };
        let shares: Vec<TaskShare> = (0..2).map(|l| task_share(&own, l, &homeless)).collect();
        assert_eq!(shares[1].cpu_ids, [4, 5]);
        assert_eq!(shares[0].cpu_ids, [6, 7]);
    }

    #[test]
    fn ready_marks_are_named_for_the_job_and_never_read_as_tasks() {
        let state = Path::new("/state");
        let mark = ready_mark(state, 12);
        assert_eq!(mark, Path::new("/state/jobs/12.ready"));
        let name = mark.file_name().unwrap().to_str().unwrap();
        assert_eq!(parse_ready_name(name), Some(12));
        assert_eq!(parse_task_dir_name(name), None);
        for bad in ["12", "12.1", ".ready", "x.ready", "12.ready.1"] {
            assert_eq!(parse_ready_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn task_directories_are_named_for_the_job_and_read_back() {
        assert_eq!(task_dir_name(12, 0), "12");
        assert_eq!(task_dir_name(12, 3), "12.3");
        assert_eq!(container_id(12, 3), "wharf-12.3");
        for (id, local) in [(1, 0), (12, 3), (u64::MAX, 1023)] {
            assert_eq!(
                parse_task_dir_name(&task_dir_name(id, local)),
                Some((id, local))
            );
        }
        for bad in [
            "", "x", "12.", ".1", "12.0", "12.01", "12.1.2", "12.x", "-1",
        ] {
            assert_eq!(parse_task_dir_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn gpus_are_named_by_uuid_to_runtimes_by_minor_to_slurm_and_from_0_to_cuda() {
        let env = |gpus: &[GpuInfo]| -> std::collections::BTreeMap<String, String> {
            let units: Vec<GpuUnit> = gpus.iter().map(|g| g.units().remove(0)).collect();
            gpu_env(&units).into_iter().collect()
        };
        let uuid = |minor: u32, u: &str| GpuInfo {
            uuid: Some(u.into()),
            ..GpuInfo::minor(minor)
        };
        let e = env(&[uuid(1, "GPU-b"), uuid(3, "GPU-d")]);
        assert_eq!(e["CUDA_VISIBLE_DEVICES"], "0,1");
        assert_eq!(e["NVIDIA_VISIBLE_DEVICES"], "GPU-b,GPU-d");
        assert_eq!(e["SLURM_JOB_GPUS"], "1,3");
        assert_eq!(e["SLURM_GPUS_ON_NODE"], "2");
        // Without every UUID, the node's own numbers.
        let e = env(&[uuid(1, "GPU-b"), GpuInfo::minor(3)]);
        assert_eq!(e["NVIDIA_VISIBLE_DEVICES"], "1,3");
        let e = env(&[]);
        assert_eq!(e["NVIDIA_VISIBLE_DEVICES"], "void");
        assert_eq!(e["CUDA_VISIBLE_DEVICES"], "");
        assert!(!e.contains_key("SLURM_JOB_GPUS"));
    }
}
