//! `wharf controller`.

use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::config::{self, FileConfig};

/// Arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Configuration file (default /etc/wharf/wharf.toml when present).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Directory for the state database.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// TCP address for agents on other hosts, e.g. 0.0.0.0:6817.
    #[arg(long)]
    listen: Option<String>,
}

/// Builds the controller settings from the file, flags and the socket.
pub fn settings(
    file: &FileConfig,
    socket: PathBuf,
    token: String,
) -> Result<wharf_controller::ControllerConfig> {
    let c = &file.controller;
    let poll_wait = config::duration("controller.poll_wait", &c.poll_wait)?;
    Ok(wharf_controller::ControllerConfig {
        state_dir: c.state_dir.clone(),
        socket,
        listen: c
            .listen
            .as_deref()
            .map(|l| {
                l.parse()
                    .with_context(|| format!("controller.listen {l:?}"))
            })
            .transpose()?,
        join_token: token,
        admins: config::admin_uids(&c.admins)?,
        defaults: file.defaults.resolve()?,
        node_timeout: config::duration("controller.node_timeout", &c.node_timeout)?,
        poll_wait,
        max_pending_per_user: file.limits.max_pending_per_user,
        max_request_bytes: file.limits.max_request_bytes()?,
        max_agent_request_bytes: file.limits.max_agent_request_bytes()?,
        connections: file.limits.connections(poll_wait)?,
        tcp: file.limits.tcp()?,
        scheduler: file.scheduler.resolve()?,
        forms: wharf_controller::FormsConfig {
            kill_invalid_dependency: file.scheduler.kill_invalid_dependency,
            max_array_size: file.limits.max_array_size,
        },
        retention: {
            let a = &file.accounting;
            match &a.keep {
                None => None,
                Some(k) => Some(wharf_controller::retention::Retention {
                    keep: config::duration("accounting.keep", k)?,
                    archive_dir: a.archive.then(|| {
                        a.archive_dir
                            .clone()
                            .unwrap_or_else(|| c.state_dir.join("archive"))
                    }),
                }),
            }
        },
        accounting: file.accounting.engine()?,
    })
}

/// Puts the controller's socket where `--socket` (or `WHARF_SOCKET`) says, if anywhere: it
/// wins over the configuration file.
pub fn set_socket(file: &mut config::FileConfig, socket: Option<&str>) -> Result<()> {
    if let Some(s) = socket {
        if s.starts_with("tcp://") {
            anyhow::bail!(
                "--socket {s:?}: the controller's socket is a path; agents on other hosts use --listen HOST:PORT"
            );
        }
        file.controller.socket = PathBuf::from(s);
    }
    Ok(())
}

/// Runs until killed. `socket` is the global `--socket` flag (or `WHARF_SOCKET`): where the
/// clients look is where the controller listens, whatever the file says.
pub async fn run(args: Args, socket: Option<&str>) -> Result<i32> {
    let mut file = config::load(args.config.as_deref())?;
    set_socket(&mut file, socket)?;
    if let Some(d) = args.state_dir {
        file.controller.state_dir = d;
    }
    if let Some(l) = args.listen {
        file.controller.listen = Some(l);
    }
    let token_file = file
        .controller
        .join_token_file
        .clone()
        .unwrap_or_else(|| file.controller.state_dir.join("join-token"));
    let token = config::join_token(&token_file, true)?;
    let socket = file.controller.socket.clone();
    let cfg = settings(&file, socket, token)?;
    tracing::info!(token_file = %token_file.display(), "agents join with the token in this file");
    wharf_controller::run(cfg).await?;
    Ok(0)
}
