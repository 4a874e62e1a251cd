//! `wharf nodes`.

use anyhow::Result;
use wharf_api::resources::format_memory;
use wharf_api::wire::{NodeList, NodeStateChange, NodeStateRequest};
use wharf_api::NodeRecord;
use wharf_client::{Client, ClientError, Endpoint};

use crate::output;

/// Arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Drain this node (admins): it keeps its running jobs and takes no new ones.
    #[arg(
        long,
        value_name = "NODE",
        conflicts_with = "resume",
        requires = "reason"
    )]
    drain: Option<String>,
    /// Why the node is drained, shown in the REASON column.
    #[arg(long, value_name = "TEXT", requires = "drain")]
    reason: Option<String>,
    /// Let a drained node take new jobs again (admins).
    #[arg(long, value_name = "NODE")]
    resume: Option<String>,
}

/// Runs the command.
pub async fn run(socket: &str, args: Args) -> Result<i32> {
    let client = Client::new(Endpoint::parse(socket), None);
    let change = match (&args.drain, &args.resume) {
        (Some(node), _) => Some((node, NodeStateChange::Drain)),
        (None, Some(node)) => Some((node, NodeStateChange::Resume)),
        (None, None) => None,
    };
    if let Some((node, state)) = change {
        let req = NodeStateRequest {
            state,
            reason: args.reason.clone(),
        };
        let path = format!("/v1/nodes/{node}/state");
        return match client.post::<_, NodeRecord>(&path, &req).await {
            Ok(n) if args.json => {
                println!("{}", serde_json::to_string_pretty(&n)?);
                Ok(0)
            }
            Ok(n) => {
                println!("node {}: {}", n.info.name, n.state.as_str());
                Ok(0)
            }
            Err(ClientError::Api { error, .. }) => {
                eprintln!("error: node {node}: {}", output::clean(&error.error));
                Ok(1)
            }
            Err(e) => Err(e.into()),
        };
    }
    let list: NodeList = client.get("/v1/nodes").await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(0);
    }
    let mut t = output::table(&[
        "NODE",
        "STATE",
        "CPUS(A/T)",
        "MEMORY(A/T)",
        "GPUS(A/T)",
        "JOBS",
        "IMAGES",
        "FEATURES",
        "REASON",
    ]);
    for n in &list.nodes {
        let cap = n.info.capacity();
        t.add_row(vec![
            n.info.name.clone(),
            n.state.as_str().to_string(),
            format!("{}/{}", n.allocated.cpus, cap.cpus),
            format!(
                "{}/{}",
                format_memory(n.allocated.memory),
                format_memory(cap.memory)
            ),
            match n.info.gpus.first().and_then(|g| g.model.as_deref()) {
                Some(model) => format!("{}/{} {model}", n.allocated.gpus, cap.gpus),
                None => format!("{}/{}", n.allocated.gpus, cap.gpus),
            },
            n.jobs.to_string(),
            n.images.len().to_string(),
            if n.info.features.is_empty() {
                "-".into()
            } else {
                n.info.features.join(",")
            },
            n.reason.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    output::print_table(&t);
    Ok(0)
}
