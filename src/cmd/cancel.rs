//! `wharf cancel`.

use anyhow::Result;
use wharf_api::JobRecord;
use wharf_client::{Client, ClientError, Endpoint};

/// Arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Job ids.
    #[arg(required = true)]
    jobs: Vec<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Runs the command. Exit status 1 if any cancel was refused.
pub async fn run(socket: &str, args: Args) -> Result<i32> {
    let client = Client::new(Endpoint::parse(socket), None);
    let mut status = 0;
    let mut done = Vec::new();
    for id in args.jobs {
        match client
            .post::<_, JobRecord>(&format!("/v1/jobs/{id}/cancel"), &serde_json::json!({}))
            .await
        {
            Ok(job) => {
                if !args.json {
                    let what = if job.state.is_terminal() {
                        job.state.to_string()
                    } else {
                        "cancelling".into()
                    };
                    println!("job {id}: {what}");
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
    if args.json {
        println!("{}", serde_json::to_string_pretty(&done)?);
    }
    Ok(status)
}
