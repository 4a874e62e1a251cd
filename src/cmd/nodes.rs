//! `wharf nodes`.

use anyhow::Result;
use wharf_api::resources::format_memory;
use wharf_api::wire::NodeList;
use wharf_client::{Client, Endpoint};

use crate::output;

/// Arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Runs the command.
pub async fn run(socket: &str, args: Args) -> Result<i32> {
    let client = Client::new(Endpoint::parse(socket), None);
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
        ]);
    }
    output::print_table(&t);
    Ok(0)
}
