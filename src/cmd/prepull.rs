//! `wharf image pull REF --nodes A,B`: an admin has the named nodes pull a registry image
//! into their own stores, through the controller, and follows each node's pull to its end.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Result;
use wharf_api::prepull::{NodePullState, PrePull, PrePullRequest};
use wharf_client::{Client, ClientError, Endpoint};

use crate::output;

/// How often the pull's state is asked for.
const EVERY: Duration = Duration::from_millis(500);

/// Pulls `reference` on `nodes` (a host list, `gpu[01-04],login1`); prints a line per node
/// each time its pull moves on, or with `json` the final state. Exit status 0 when every node
/// has the image, 1 when any failed or the request was refused.
pub async fn run(socket: &str, reference: &str, nodes: &str, json: bool) -> Result<i32> {
    // Checked here too, for an error before anything is sent.
    let image: wharf_images::ImageRef = reference
        .parse()
        .map_err(|e: String| anyhow::anyhow!("{reference:?} is not a registry reference: {e}"))?;
    let names = wharf_api::hostlist::expand(nodes, 10_000)
        .map_err(|e| anyhow::anyhow!("--nodes {nodes:?}: {e}"))?;
    let client = Client::new(Endpoint::parse(socket), None);
    let req = PrePullRequest {
        image: image.to_string(),
        nodes: names,
    };
    let mut pull: PrePull = match client.post("/v1/images/pull", &req).await {
        Ok(p) => p,
        Err(ClientError::Api { error, .. }) => {
            eprintln!(
                "error: cannot pull {image} on nodes: {}",
                output::clean(&error.error)
            );
            return Ok(1);
        }
        Err(e) => return Err(e.into()),
    };
    let mut shown: BTreeMap<String, String> = BTreeMap::new();
    loop {
        if !json {
            for n in &pull.nodes {
                let line = n.describe();
                if shown.get(&n.node) != Some(&line) {
                    println!("{}: {}", output::clean(&n.node), output::clean(&line));
                    shown.insert(n.node.clone(), line);
                }
            }
        }
        if pull.finished() {
            break;
        }
        tokio::time::sleep(EVERY).await;
        pull = match client.get(&format!("/v1/images/pull/{}", pull.id)).await {
            Ok(p) => p,
            Err(ClientError::Api { error, .. }) => {
                eprintln!(
                    "error: following the pull of {image}: {}",
                    output::clean(&error.error)
                );
                return Ok(1);
            }
            Err(e) => return Err(e.into()),
        };
    }
    let failed = pull
        .nodes
        .iter()
        .filter(|n| n.state == NodePullState::Failed)
        .count();
    if json {
        println!("{}", serde_json::to_string_pretty(&pull)?);
    } else if failed == 0 {
        println!(
            "Pulled {} on {} nodes",
            output::clean(&pull.image),
            pull.nodes.len()
        );
    } else {
        eprintln!(
            "error: {failed} of {} nodes could not pull {}",
            pull.nodes.len(),
            output::clean(&pull.image)
        );
    }
    Ok(i32::from(failed > 0))
}
