//! `wharf requeue`.

use anyhow::Result;
use clap::Args as ClapArgs;

/// Arguments.
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// Job ids (running jobs).
    #[arg(value_parser = super::job_arg, required = true)]
    jobs: Vec<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Stops each running job and puts it back in the queue. Exit status 1 if any was refused.
pub async fn run(socket: &str, args: Args) -> Result<i32> {
    super::cancel::post_each(socket, &args.jobs, args.json, "requeue", |_| {
        "stopping; it goes back to the queue once it has ended".into()
    })
    .await
}
