//! `wharf dev`: controller and agent in one process, for one machine.

use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::config;

/// Arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Configuration file (default /etc/wharf/wharf.toml when present).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Where the database and job directories go.
    #[arg(long, default_value = "/var/lib/wharf/dev")]
    data_dir: PathBuf,
}

/// Runs both until killed. `socket` is the global `--socket` flag (or `WHARF_SOCKET`): where
/// the controller listens, over the configuration file's.
pub async fn run(args: Args, socket: Option<&str>) -> Result<i32> {
    if !nix::unistd::geteuid().is_root() {
        anyhow::bail!("`wharf dev` runs the node agent and must run as root (e.g. with sudo)");
    }
    let mut file = config::load(args.config.as_deref())?;
    super::controller::set_socket(&mut file, socket)?;
    // The data dir may hold the socket, which users must reach; its contents are private
    // (the controller's directory 0700, the agent's 0711 with 0600 files), so it is 0711:
    // passable, not listable.
    wharf_controller::private::dir(&args.data_dir, 0o711)
        .with_context(|| format!("securing {}", args.data_dir.display()))?;
    file.controller.state_dir = args.data_dir.join("controller");
    file.agent.state_dir = args.data_dir.join("agent");
    // The agent talks to the controller over its own socket; the token lives only in memory.
    file.agent.controller = file.controller.socket.display().to_string();
    let token = wharf_client::random_hex(32)?;
    let controller =
        super::controller::settings(&file, file.controller.socket.clone(), token.clone())?;
    let agent = super::agent::settings(&file, token)?;
    eprintln!(
        "wharf dev: controller on {}, node {}, data in {}",
        controller.socket.display(),
        agent.node_name,
        args.data_dir.display()
    );
    let c = tokio::spawn(wharf_controller::run(controller));
    // Give the socket a moment to appear; the agent retries anyway.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let a = tokio::spawn(wharf_agent::run(agent));
    tokio::select! {
        r = c => r??,
        r = a => r??,
    }
    Ok(0)
}
