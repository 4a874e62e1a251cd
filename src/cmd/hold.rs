//! `wharf hold` and `wharf release`.

use anyhow::Result;
use wharf_api::Hold;

/// Arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Job ids (pending jobs).
    #[arg(value_parser = super::job_arg, required = true)]
    jobs: Vec<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Holds (`release` false) or releases each job. Exit status 1 if any was refused.
pub async fn run(socket: &str, args: Args, release: bool) -> Result<i32> {
    let action = if release { "release" } else { "hold" };
    super::cancel::post_each(socket, &args.jobs, args.json, action, |job| {
        match job.hold {
            None => "released",
            Some(Hold::User) => "held (by its owner)",
            Some(Hold::Admin) => "held by an admin",
        }
        .into()
    })
    .await
}
