//! `wharf nodes`.

use anyhow::Result;
use wharf_api::resources::format_duration;
use wharf_api::resources::format_memory;
use wharf_api::wire::{
    KeyForgotten, NodeKeyList as KeyList, NodeList, NodeStateChange, NodeStateRequest,
    PartitionList,
};
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
    #[arg(long, value_name = "NODE", conflicts_with = "forget_key")]
    resume: Option<String>,
    /// Forget a node's key (admins): its agent must join again with the cluster's join
    /// token. For a reinstalled node that lost its key (its agent says it cannot join); for a
    /// node no longer trusted, make a new join token first (docs/security.md).
    #[arg(long, value_name = "NODE", conflicts_with = "drain")]
    forget_key: Option<String>,
    /// List the nodes that hold a key (admins): when each joined, and when its agent first
    /// registered with that key (a name that joined and never registered is one to look at).
    #[arg(long, conflicts_with_all = ["drain", "resume", "forget_key", "partitions"])]
    keys: bool,
    /// One line per partition instead (Slurm's `sinfo -s`): its state, time limit, nodes
    /// allocated/mixed/idle/other, CPUs and GPUs in use, and jobs running and pending; `*`
    /// marks the default partition.
    #[arg(short, long, conflicts_with_all = ["drain", "resume", "forget_key"])]
    partitions: bool,
}

/// Runs the command.
pub async fn run(socket: &str, args: Args) -> Result<i32> {
    let client = Client::new(Endpoint::parse(socket), None);
    if args.keys {
        let list: KeyList = client.get("/v1/nodes/keys").await?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&list)?);
        } else {
            let mut t = output::table(&["NODE", "JOINED", "REGISTERED"]);
            for k in &list.keys {
                let registered = match k.registered {
                    Some(at) => output::time(Some(at)),
                    None => "never".to_string(),
                };
                t.add_row([
                    &*output::clean(&k.node),
                    &output::time(Some(k.joined)),
                    &registered,
                ]);
            }
            output::print_table(&t);
        }
        return Ok(0);
    }
    if let Some(node) = &args.forget_key {
        let path = format!("/v1/nodes/{node}/forget-key");
        return post_change(&client, &path, &(), node, args.json, |f: &KeyForgotten| {
            format!(
                "node {}: key forgotten; its agent joins again with the join token",
                output::clean(&f.node)
            )
        })
        .await;
    }
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
        return post_change(&client, &path, &req, node, args.json, |n: &NodeRecord| {
            format!("node {}: {}", n.info.name, n.state.as_str())
        })
        .await;
    }
    if args.partitions {
        let list: PartitionList = client.get("/v1/partitions").await?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&list)?);
        } else {
            output::print_table(&partition_table(&list));
        }
        return Ok(0);
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

/// Posts an admin's change of `node` to `path` and prints the answer (`json`, else `said`);
/// a refusal is printed on standard error with exit status 1.
async fn post_change<B: serde::Serialize, T: serde::Serialize + serde::de::DeserializeOwned>(
    client: &Client,
    path: &str,
    body: &B,
    node: &str,
    json: bool,
    said: impl Fn(&T) -> String,
) -> Result<i32> {
    match client.post::<_, T>(path, body).await {
        Ok(answer) if json => {
            println!("{}", serde_json::to_string_pretty(&answer)?);
            Ok(0)
        }
        Ok(answer) => {
            println!("{}", said(&answer));
            Ok(0)
        }
        Err(ClientError::Api { error, .. }) => {
            eprintln!("error: node {node}: {}", output::clean(&error.error));
            Ok(1)
        }
        Err(e) => Err(e.into()),
    }
}

/// The `--partitions` table.
fn partition_table(list: &PartitionList) -> output::Table {
    let mut t = output::table(&[
        "PARTITION",
        "AVAIL",
        "TIMELIMIT",
        "TIER",
        "NODES(A/M/I/O)",
        "CPUS(A/T)",
        "GPUS(A/T)",
        "JOBS(R/PD)",
    ]);
    for p in &list.partitions {
        let star = if p.default { "*" } else { "" };
        t.cell_fmt(format_args!("{}{star}", p.name));
        t.cell(&p.state);
        match p.max_time_s {
            Some(s) => t.cell(&format_duration(s)),
            None => t.cell("infinite"),
        }
        t.cell_fmt(format_args!("{}", p.tier));
        let n = p.nodes;
        t.cell_fmt(format_args!(
            "{}/{}/{}/{}",
            n.allocated, n.mixed, n.idle, n.other
        ));
        t.cell_fmt(format_args!("{}/{}", p.cpus.0, p.cpus.1));
        t.cell_fmt(format_args!("{}/{}", p.gpus.0, p.gpus.1));
        t.cell_fmt(format_args!("{}/{}", p.running, p.pending));
        t.end_row();
    }
    t
}

#[cfg(test)]
mod tests {
    use wharf_api::wire::{NodeCounts, PartitionList, PartitionSummary};

    #[test]
    fn partitions_are_summed_up_one_a_line_with_the_default_starred() {
        let part = |name: &str, default, max_time_s| PartitionSummary {
            name: name.into(),
            state: "UP".into(),
            default,
            tier: 0,
            max_time_s,
            nodes: NodeCounts {
                allocated: 1,
                mixed: 2,
                idle: 3,
                other: 4,
            },
            cpus: (40, 192),
            gpus: (12, 16),
            running: 7,
            pending: 30,
            node_names: None,
        };
        let list = PartitionList {
            partitions: vec![
                part("batch", true, None),
                part("short\u{7}", false, Some(600)),
            ],
        };
        let mut out = Vec::new();
        super::partition_table(&list).write(&mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "PARTITION  AVAIL  TIMELIMIT  TIER  NODES(A/M/I/O)  CPUS(A/T)  GPUS(A/T)  JOBS(R/PD)\n\
             batch*     UP     infinite   0     1/2/3/4         40/192     12/16      7/30\n\
             short\\x07  UP     00:10:00   0     1/2/3/4         40/192     12/16      7/30\n"
        );
    }
}
