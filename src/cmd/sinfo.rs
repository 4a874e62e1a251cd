//! `wharf sinfo`, Slurm's sinfo: partitions and their nodes by state, as its users and their
//! scripts read them. Made on the client from `/v1/partitions` (with each partition's node
//! names) and `/v1/nodes`.

use std::collections::BTreeSet;

use anyhow::Result;
use wharf_api::hostlist;
use wharf_api::wire::{NodeList, PartitionList};
use wharf_client::{Client, Endpoint};

mod format;
mod lines;
mod state;

use lines::{Cluster, Filter, Line};

/// The default listing's format (sinfo's): a line per partition and node state.
const DEFAULT: &str = "%#P %.5a %.10l %.6D %.6t %N";
/// `-l`'s: states in long words.
const LONG: &str = "%#P %.5a %.10l %.6D %.10T %N";
/// `-N`'s: a line per node and partition.
const NODES: &str = "%#N %.6D %#P %.6t";
/// `-N -l`'s.
const NODES_LONG: &str = "%#N %.6D %#P %.11T %.4c %.8m %#G %#f %E";
/// `-s`'s: a line per partition.
const SUMMARY: &str = "%#P %.5a %.10l %.16F %N";
/// `-R`'s: why nodes take no work. sinfo cuts the reason at 20 characters and the user at 9;
/// here they are whole, and the time, in UTC, says so with a `Z`.
const REASONS: &str = "%#E %#U %#H %N";

/// Arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// One line per node (and partition it is in): NODELIST NODES PARTITION STATE. A node in
    /// no partition is listed once, its partition n/a.
    #[arg(short = 'N', long = "Node")]
    node: bool,
    /// Only these partitions.
    #[arg(short, long, value_delimiter = ',', value_name = "PARTITION")]
    partition: Vec<String>,
    /// Only these nodes, as a host list (gpu[01-04],cpu1).
    #[arg(short = 'n', long, value_name = "NODES")]
    nodes: Option<String>,
    /// One line per partition: NODES(A/I/O/T) counts its nodes allocated (or mixed, or
    /// draining with jobs), idle, other (down, drained, never registered) and in all.
    #[arg(short, long, conflicts_with_all = ["node", "list_reasons"])]
    summarize: bool,
    /// Only nodes in these states: idle, mix, alloc, comp, drng, drain (drained or
    /// draining), drained, down (not answering), unk (never registered), all.
    #[arg(
        short = 't',
        long = "states",
        value_delimiter = ',',
        value_name = "STATES"
    )]
    states: Vec<String>,
    /// Why nodes take no work (drained, down, never registered, or still killing what they
    /// ran of ended jobs): REASON USER TIMESTAMP NODELIST.
    #[arg(short = 'R', long, conflicts_with = "node")]
    list_reasons: bool,
    /// States in long words; with -N, the nodes' CPUs, memory, GPUs, features and reason.
    #[arg(short, long)]
    long: bool,
    /// Lines of sinfo's `%` fields, e.g. "%P %a %l %D %t %N": %P partition (`*`: the
    /// default), %R partition unmarked, %a its state, %l its time limit, %D nodes, %t state,
    /// %T state in long words, %N node list, %c CPUs, %m memory (MB), %G GPUs, %f features,
    /// %E reason, %U who gave it, %H since when, %F nodes A/I/O/T, %C CPUs A/I/O/T. %[.]N
    /// sizes a field (cut to N, `.` to the right), %#X makes it as wide as its widest value,
    /// %% is %. Lines group nodes by partition and state (with -N: by node, with -s: by
    /// partition).
    #[arg(short = 'o', long, value_name = "FORMAT", conflicts_with_all = ["json", "list_reasons"])]
    format: Option<String>,
    /// No header line (sinfo -h; help is --help here).
    #[arg(short = 'h', long)]
    noheader: bool,
    /// Print JSON: the lines, each with its partition, state and nodes (with -s, the
    /// partitions as `wharf nodes -p --json` prints them).
    #[arg(long)]
    json: bool,
    /// Print help.
    #[arg(long, action = clap::ArgAction::Help)]
    help: Option<bool>,
}

/// Runs the command.
pub async fn run(socket: &str, args: Args) -> Result<i32> {
    let client = Client::new(Endpoint::parse(socket), None);
    let states = state::picked(&args.states)?;
    let named = match &args.nodes {
        Some(list) => Some(node_names(list)?),
        None => None,
    };
    let mut parts: PartitionList = client.get("/v1/partitions").await?;
    check_partitions(&parts, &args.partition)?;
    let filter = Filter {
        partitions: &args.partition,
        states: &states,
        nodes: named.as_ref(),
    };
    if args.summarize && args.json {
        parts.partitions.retain(|p| filter.keeps_partition(p));
        println!("{}", serde_json::to_string_pretty(&parts)?);
        return Ok(0);
    }
    let nodes: NodeList = client.get("/v1/nodes").await?;
    let cluster = Cluster::new(&parts, &nodes.nodes);
    let (lines, format) = match (args.summarize, args.node, args.list_reasons) {
        (true, _, _) => (cluster.by_partition(&filter), SUMMARY),
        (_, true, _) => (
            cluster.by_node(&filter),
            [NODES, NODES_LONG][args.long as usize],
        ),
        (_, _, true) => (cluster.by_reason(&filter), REASONS),
        _ => (
            cluster.by_state(&filter),
            [DEFAULT, LONG][args.long as usize],
        ),
    };
    if args.json {
        let lines: Vec<JsonLine> = lines.iter().map(JsonLine::of).collect();
        println!("{}", serde_json::to_string_pretty(&Json { lines })?);
        return Ok(0);
    }
    let format = format::Format::parse(args.format.as_deref().unwrap_or(format))?;
    format.print(&lines, !args.noheader);
    Ok(0)
}

/// `-n`'s host list, expanded.
fn node_names(list: &str) -> Result<BTreeSet<String>> {
    let names = hostlist::expand(list, hostlist::MAX_HOSTS).map_err(|e| {
        anyhow::anyhow!("-n: {e}; write node names as a host list (gpu[01-04],cpu1)")
    })?;
    Ok(names.into_iter().collect())
}

/// That the controller names each partition's nodes, which sinfo groups (one older than
/// that does not), and that the partitions `named` are the cluster's.
fn check_partitions(parts: &PartitionList, named: &[String]) -> Result<()> {
    if parts.partitions.iter().any(|p| p.node_names.is_none()) {
        anyhow::bail!(
            "the controller does not say which nodes each partition has: it is older than \
             sinfo; upgrade it, or use `wharf nodes` and `wharf nodes -p`"
        );
    }
    let has = |n: &String| parts.partitions.iter().any(|p| p.name == *n);
    if let Some(unknown) = named.iter().find(|n| !has(n)) {
        let all: Vec<&str> = parts.partitions.iter().map(|p| p.name.as_str()).collect();
        anyhow::bail!(
            "-p: no partition {:?}; this cluster has: {}",
            crate::output::clean(unknown),
            all.join(", ")
        );
    }
    Ok(())
}

/// `--json`'s answer.
#[derive(serde::Serialize)]
struct Json<'a> {
    lines: Vec<JsonLine<'a>>,
}

/// One line in `--json`: the exact values the text shows.
#[derive(serde::Serialize)]
struct JsonLine<'a> {
    /// `None`: nodes in no partition, or `-R`'s line.
    #[serde(skip_serializing_if = "Option::is_none")]
    partition: Option<&'a str>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    default: bool,
    /// The partition's state in sinfo's word (up, down, drain, inact).
    #[serde(skip_serializing_if = "Option::is_none")]
    avail: Option<String>,
    /// The partition's time limit, seconds (none: no limit).
    #[serde(skip_serializing_if = "Option::is_none")]
    max_time_s: Option<u64>,
    /// The nodes' states in sinfo's long words, each once.
    states: Vec<&'static str>,
    /// The nodes by name.
    nodes: Vec<&'a str>,
    /// The nodes as a host list.
    nodelist: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    user: Option<String>,
    /// Since when the reason holds, ms since the Unix epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    since: Option<u64>,
}

impl<'a> JsonLine<'a> {
    fn of(l: &Line<'a>) -> JsonLine<'a> {
        let p = l.partition;
        let names: Vec<&str> = l.nodes.iter().map(|n| n.name).collect();
        let states = lines::states(&l.nodes).into_iter().map(state::State::long);
        JsonLine {
            partition: p.map(|p| p.name.as_str()),
            default: p.is_some_and(|p| p.default),
            avail: p.map(|p| format::avail(&p.state)),
            max_time_s: p.and_then(|p| p.max_time_s),
            states: states.collect(),
            nodelist: hostlist::compress(&names),
            nodes: names,
            reason: l.reason.as_ref().map(|r| r.text.clone()),
            user: l.reason.as_ref().map(|r| r.user.clone()),
            since: l.reason.as_ref().and_then(|r| r.since),
        }
    }
}
