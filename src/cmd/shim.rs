//! `wharf shim DIR`: the per-job supervisor (see `wharf_runtime::shim`); `wharf shim
//! --spawner`: the agent's pre-started process that forks them (see `wharf_runtime::spawner`).

use std::path::PathBuf;

/// Arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The job directory (spec.json in, outcome.json out).
    #[arg(required_unless_present = "spawner")]
    dir: Option<PathBuf>,
    /// Fork a shim for each job directory read from stdin, answering `PID STARTTIME`.
    #[arg(long, conflicts_with = "dir")]
    spawner: bool,
}

/// Runs the shim; returns its exit status.
pub fn run(args: &Args) -> i32 {
    // Libraries the shim uses (bollard, libcgroups) log through `tracing`; keep errors in the
    // shim's log, without colours.
    let filter = tracing_subscriber::EnvFilter::try_from_env("WHARF_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .init();
    match &args.dir {
        Some(dir) => wharf_runtime::shim::main(dir),
        None => wharf_runtime::spawner::serve(),
    }
}
