//! `wharf cancel`.

use anyhow::Result;
use wharf_api::JobRecord;
use wharf_client::{Client, ClientError, Endpoint};

/// Arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Job ids.
    #[arg(value_parser = super::job_arg, required = true)]
    jobs: Vec<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Runs the command. Exit status 1 if any cancel was refused.
pub async fn run(socket: &str, args: Args) -> Result<i32> {
    post_each(socket, &args.jobs, args.json, "cancel", |job| {
        if job.state.is_terminal() {
            job.state.to_string()
        } else {
            "cancelling".into()
        }
    })
    .await
}

/// Posts `/v1/jobs/ID/ACTION` for each job, printing `job ID: WHAT` (or, with `json`, the
/// changed jobs at the end). Exit status 1 if the controller refused any of them.
pub async fn post_each(
    socket: &str,
    jobs: &[String],
    json: bool,
    action: &str,
    what: impl Fn(&JobRecord) -> String,
) -> Result<i32> {
    let client = Client::new(Endpoint::parse(socket), None);
    let mut status = 0;
    let mut done = Vec::new();
    for id in jobs {
        match client
            .post::<_, JobRecord>(&format!("/v1/jobs/{id}/{action}"), &serde_json::json!({}))
            .await
        {
            Ok(job) => {
                if !json {
                    println!("job {id}: {}", what(&job));
                }
                done.push(job);
            }
            Err(ClientError::Api { error, .. }) => {
                eprintln!("error: job {id}: {}", crate::output::clean(&error.error));
                status = 1;
            }
            Err(e) => return Err(e.into()),
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&done)?);
    }
    Ok(status)
}
