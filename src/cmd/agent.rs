//! `wharf agent`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use wharf_client::Endpoint;

use crate::config::{self, FileConfig};

/// Arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Configuration file (default /etc/wharf/wharf.toml when present).
    #[arg(long)]
    config: Option<PathBuf>,
    /// The controller: `host:port` or a socket path.
    #[arg(long)]
    controller: Option<String>,
    /// File holding the join token (printed by the controller at start).
    #[arg(long)]
    join_token_file: Option<PathBuf>,
    /// A copy of the controller's `ca.pem`, which checks a `host:port` controller (default:
    /// `ca.pem` beside the join token file).
    #[arg(long)]
    controller_ca: Option<PathBuf>,
    /// This node's name (default: the host name).
    #[arg(long)]
    node_name: Option<String>,
    /// Directory for job directories.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Print what this node would offer (CPUs, memory, GPUs from NVML or the device nodes)
    /// and exit, without contacting the controller.
    #[arg(long)]
    probe: bool,
    /// With --probe: print JSON.
    #[arg(long, requires = "probe")]
    json: bool,
}

/// Builds the agent settings from the file.
pub fn settings(file: &FileConfig, token: String) -> Result<wharf_agent::AgentConfig> {
    let a = &file.agent;
    Ok(wharf_agent::AgentConfig {
        controller: Endpoint::parse(&a.controller),
        // Set by `run` for a TCP controller: a probe talks to no controller.
        controller_tls: None,
        token,
        node_name: a.node_name.clone().unwrap_or_else(config::hostname),
        state_dir: a.state_dir.clone(),
        image_store: a.image_store.clone(),
        registry: file.images.registry()?,
        cache_quota: file.images.quota()?,
        shared_cache: file.images.shared_cache()?,
        shim_exe: std::env::current_exe().context("locating the wharf binary for the shim")?,
        root_host_id: a.root_host_id,
        grace_secs: config::duration("agent.grace", &a.grace)?.as_secs(),
        tmp_size: config::size("agent.tmp_size", &a.tmp_size)?,
        shm_size: config::size("agent.shm_size", &a.shm_size)?,
        pids_limit: a.pids_limit,
        cgroup_parent: a.cgroup_parent.clone(),
        reserved_memory: config::size("agent.reserved_memory", &a.reserved_memory)?,
        dev_root: a.dev_root.clone(),
        nvml: a.nvml,
        sample_interval: config::duration_or_off("agent.sample_interval", &a.sample_interval)?,
        backend: match a.backend.as_str() {
            "oci" => wharf_agent::BackendKind::Oci,
            "docker" => wharf_agent::BackendKind::Docker(a.docker_socket.clone()),
            other => {
                anyhow::bail!("agent.backend: unknown backend {other:?}; use \"oci\" or \"docker\"")
            }
        },
        binds: config::binds(&a.mounts)?,
        allowed_mounts: a.allowed_mounts.clone(),
        cdi_dirs: a.cdi_dirs.clone(),
        driver_lib_dirs: a.driver_lib_dirs.clone(),
        driver_bin_dirs: a.driver_bin_dirs.clone(),
        features: {
            wharf_api::features::validate_features(&a.features)
                .map_err(|e| anyhow::anyhow!("agent.features: {e}"))?;
            a.features.clone()
        },
        fabric_interface: a.fabric_interface.clone(),
        job_env: a
            .env
            .iter()
            .map(|(k, v)| {
                wharf_api::job::check_env_var(k, v)
                    .map(|()| (k.clone(), v.clone()))
                    .map_err(|e| anyhow::anyhow!("agent.env: {e}"))
            })
            .collect::<Result<_>>()?,
        stack: a
            .stack
            .as_deref()
            .map(|s| config::limit("agent.stack", s))
            .transpose()?,
        memlock: Some(config::limit("agent.memlock", &a.memlock)?).filter(|&m| m != u64::MAX),
    })
}

/// The join token's file: `agent.join_token_file`, or `join-token` in the controller's state
/// directory (a node that runs the controller, or a copy made in the same place).
fn join_token_file(file: &FileConfig) -> PathBuf {
    file.agent
        .join_token_file
        .clone()
        .unwrap_or_else(|| file.controller.state_dir.join("join-token"))
}

/// How the agent checks a TCP controller: by the authority in `agent.controller_ca`, or in
/// `ca.pem` beside the join token file.
fn controller_tls(file: &FileConfig) -> Result<wharf_client::Tls> {
    let ca = file
        .agent
        .controller_ca
        .clone()
        .unwrap_or_else(|| join_token_file(file).with_file_name("ca.pem"));
    wharf_client::Tls::from_ca_file(&ca).map_err(|e| match ca.try_exists() {
        Ok(false) => anyhow::anyhow!(
            "the controller {} speaks TLS, checked with its certificate authority, and {} is \
             missing: copy the controller's ca.pem (in its state directory) there, or set \
             agent.controller_ca",
            file.agent.controller,
            ca.display()
        ),
        _ => anyhow::anyhow!("the controller's certificate authority {e}"),
    })
}

/// Runs until killed.
pub async fn run(args: Args) -> Result<i32> {
    if args.probe {
        return probe(&args);
    }
    if !nix::unistd::geteuid().is_root() {
        anyhow::bail!(
            "the agent must run as root: it creates cgroups, namespaces and mounts for jobs"
        );
    }
    let mut file = config::load(args.config.as_deref())?;
    let a = &mut file.agent;
    if let Some(c) = args.controller {
        a.controller = c;
    }
    if let Some(f) = args.join_token_file {
        a.join_token_file = Some(f);
    }
    if let Some(f) = args.controller_ca {
        a.controller_ca = Some(f);
    }
    if let Some(n) = args.node_name {
        a.node_name = Some(n);
    }
    if let Some(d) = args.state_dir {
        a.state_dir = d;
    }
    let token_file = join_token_file(&file);
    // The step socket's shares are fractions of it (as the controller's connection caps
    // are); jobs inherit it, as containers get a high limit from Docker.
    let nofile = wharf_controller::serve::raise_nofile_limit();
    tracing::debug!(nofile, "descriptor limit");
    let mut cfg = settings(&file, String::new())?;
    if let Endpoint::Tcp(_) = cfg.controller {
        cfg.controller_tls = Some(controller_tls(&file)?);
    }
    // Once the node has joined, its agent needs no join token: it holds a key of its own.
    match config::join_token(&token_file, false) {
        Ok(t) => cfg.token = t,
        Err(e) if token_file.exists() || wharf_agent::node_key::kept(&cfg).is_none() => {
            return Err(e)
        }
        Err(_) => {
            tracing::info!(file = %token_file.display(), "no join token: this node uses the key it kept, and cannot join again without a token");
        }
    }
    wharf_agent::run(cfg).await?;
    Ok(0)
}

/// `wharf agent --probe`: the node as the agent would register it.
fn probe(args: &Args) -> Result<i32> {
    let file = config::load(args.config.as_deref())?;
    let cfg = settings(&file, String::new())?;
    let info = wharf_agent::node_info(&cfg, &wharf_agent::probe(&cfg));
    if args.json {
        println!("{}", serde_json::to_string_pretty(&info)?);
        return Ok(0);
    }
    println!("node    {}", crate::output::clean(&info.name));
    println!("cpus    {}", info.cpus);
    println!(
        "memory  {} (after agent.reserved_memory)",
        wharf_api::resources::format_memory(info.memory)
    );
    println!("gpus    {}", info.gpus.len());
    for g in &info.gpus {
        let place = match (&g.pci_bus, g.numa_node) {
            (Some(bus), Some(numa)) => format!("{bus} numa {numa}"),
            (Some(bus), None) => bus.clone(),
            (None, _) => String::new(),
        };
        println!(
            "  /dev/nvidia{:<3} {:<6} {:<28} {:<10} {:<22} {}",
            g.index,
            g.nvml_index
                .map(|i| format!("nvml {i}"))
                .unwrap_or_default(),
            crate::output::clean(
                g.model
                    .as_deref()
                    .unwrap_or("(model unknown: no NVML or driver files)")
            ),
            g.memory
                .map(wharf_api::resources::format_memory)
                .unwrap_or_default(),
            place,
            crate::output::clean(g.uuid.as_deref().unwrap_or(""))
        );
        for m in &g.mig {
            println!(
                "      MIG {:<10} {:<10} {}",
                crate::output::clean(&m.profile),
                m.memory
                    .map(wharf_api::resources::format_memory)
                    .unwrap_or_default(),
                crate::output::clean(&m.uuid)
            );
        }
    }
    if !info.cpu_numa.is_empty() {
        let nodes: std::collections::BTreeSet<u32> = info.cpu_numa.iter().copied().collect();
        println!("numa    {} nodes", nodes.len());
    }
    Ok(0)
}
