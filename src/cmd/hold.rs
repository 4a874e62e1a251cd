//! `wharf hold` and `wharf release`.

use anyhow::Result;
use wharf_api::{Hold, JobRecord};
use wharf_client::{Client, ClientError, Endpoint};

/// Arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Job ids (pending jobs).
    #[arg(required = true)]
    jobs: Vec<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Holds (`release` false) or releases each job. Exit status 1 if any was refused.
pub async fn run(socket: &str, args: Args, release: bool) -> Result<i32> {
    let client = Client::new(Endpoint::parse(socket), None);
    let action = if release { "release" } else { "hold" };
    let mut status = 0;
    let mut done = Vec::new();
    for id in args.jobs {
        match client
            .post::<_, JobRecord>(&format!("/v1/jobs/{id}/{action}"), &serde_json::json!({}))
            .await
        {
            Ok(job) => {
                if !args.json {
                    let what = match job.hold {
                        None => "released",
                        Some(Hold::User) => "held (by its owner)",
                        Some(Hold::Admin) => "held by an admin",
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
