//! `wharf eff JOB`: how well an ended job used what it held (as Slurm's `seff`), with hints.

use anyhow::Result;
use serde::Serialize;
use wharf_api::resources::{format_duration, format_memory};
use wharf_api::usage::JobUsage;
use wharf_api::JobRecord;
use wharf_client::{Client, Endpoint};

use crate::output;

/// Arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Job id, or ARRAYID_TASKID for one task of an array.
    #[arg(value_parser = super::job_arg)]
    job: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Below this share of what it held, a resource counts as mostly idle.
const LOW: f64 = 0.25;

/// What `wharf eff --json` prints.
#[derive(Debug, Serialize)]
struct Efficiency<'a> {
    id: String,
    state: &'a str,
    elapsed_ms: Option<u64>,
    cpus: u32,
    memory: u64,
    gpus: u32,
    cpu_efficiency: Option<f64>,
    memory_efficiency: Option<f64>,
    gpu_utilization: Option<f64>,
    usage: Option<JobUsage>,
    hints: Vec<String>,
}

/// Runs the command.
pub async fn run(socket: &str, args: Args) -> Result<i32> {
    let client = Client::new(Endpoint::parse(socket), None);
    let j: JobRecord = client.get(&format!("/v1/jobs/{}", args.job)).await?;
    let e = efficiency(&j);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&e)?);
        return Ok(0);
    }
    let r = &j.resources;
    println!(
        "Job {} ({}) {}: {} CPUs, {} memory, {} GPUs, ran {}",
        e.id,
        e.state,
        output::clean(&j.owner.user),
        r.cpus,
        format_memory(r.memory),
        r.gpus,
        e.elapsed_ms
            .map(|ms| format_duration(ms / 1000))
            .unwrap_or_else(|| "-".into())
    );
    let Some(u) = e.usage.as_ref() else {
        if j.spec.is_none() {
            // The controller leaves out what another user's job used, with its spec.
            println!("Its usage is shown only to its owner and to admins.");
        } else {
            println!("No usage was recorded: the job has not ended, or never started.");
        }
        return Ok(0);
    };
    for line in lines(u, &e) {
        println!("{line}");
    }
    for h in &e.hints {
        println!("Hint: {h}");
    }
    Ok(0)
}

fn efficiency(j: &JobRecord) -> Efficiency<'_> {
    // A job still running has run until now.
    let now = (j.state.holds_resources()).then(wharf_controller::now_ms);
    let elapsed_ms = j
        .start_time
        .zip(j.end_time.or(now))
        .map(|(s, e)| e.saturating_sub(s));
    // Its steps' too: most jobs that use srun do their work there.
    let usage = j.usage_with_steps();
    let r = &j.resources;
    let mut e = Efficiency {
        id: match &j.array {
            Some(a) => format!("{} (array task {})", j.id, a.label()),
            None => j.id.to_string(),
        },
        state: j.state.as_str(),
        elapsed_ms,
        // A gang's CPU time and GPUs are summed over its nodes; its memory peak is one node's.
        cpus: r.cpus * j.node_count(),
        memory: r.memory,
        gpus: r.gpus * j.node_count(),
        cpu_efficiency: (usage.as_ref())
            .and_then(|u| u.cpu_efficiency(elapsed_ms?, r.cpus * j.node_count())),
        memory_efficiency: usage.as_ref().and_then(|u| u.memory_efficiency(r.memory)),
        gpu_utilization: usage.as_ref().and_then(JobUsage::gpu_util),
        usage,
        hints: vec![],
    };
    e.hints = hints(&e);
    e
}

/// The summary lines of a job's measured use.
fn lines(u: &JobUsage, e: &Efficiency) -> Vec<String> {
    let pct = |x: f64| format!("{:.1}%", x * 100.0);
    let mut out = Vec::new();
    if let (Some(cpu_ms), Some(eff)) = (u.cpu_time_ms, e.cpu_efficiency) {
        out.push(format!(
            "CPU:    {} efficiency ({} of CPU time over {} CPUs for {})",
            pct(eff),
            format_duration(cpu_ms / 1000),
            e.cpus,
            format_duration(e.elapsed_ms.unwrap_or(0) / 1000)
        ));
    }
    if let Some(peak) = u.memory_peak {
        out.push(format!(
            "Memory: peak {} of {} ({}){}",
            format_memory(peak),
            format_memory(e.memory),
            e.memory_efficiency.map(pct).unwrap_or_default(),
            u.memory_avg
                .map(|a| format!(", average {}", format_memory(a)))
                .unwrap_or_default()
        ));
    }
    for g in &u.gpus {
        out.push(format!(
            "GPU {}:  utilization {}% average, {}% peak; memory peak {}{}",
            g.id,
            g.util_avg,
            g.util_peak,
            format_memory(g.memory_peak),
            g.energy_j
                .map(|j| format!("; energy {j} J"))
                .unwrap_or_default()
        ));
    }
    if e.gpus > 0 && u.gpus.is_empty() {
        out.push("GPUs:   not measured (no NVML on the node, or the job was too short)".into());
    }
    if let (Some(r), Some(w)) = (u.io_read, u.io_write) {
        out.push(format!(
            "I/O:    {} read, {} written",
            format_memory(r),
            format_memory(w)
        ));
    }
    out
}

/// What to ask for next time, where the job held much more than it used.
fn hints(e: &Efficiency) -> Vec<String> {
    let mut out = Vec::new();
    if let (Some(eff), true) = (e.cpu_efficiency, e.cpus > 1) {
        if eff < LOW {
            let busy = eff * f64::from(e.cpus);
            let ask = busy.ceil().max(1.0) as u32;
            // Less than a CPU's worth is said as it is, not rounded up to one busy CPU.
            let kept = if busy < 0.95 {
                format!(
                    "less than one of its {} CPUs busy ({:.0}% of one)",
                    e.cpus,
                    busy * 100.0
                )
            } else {
                format!("about {ask} of its {} CPUs busy", e.cpus)
            };
            out.push(format!(
                "it kept {kept}: ask for --cpus {ask}, or check that it runs in parallel"
            ));
        }
    }
    if let (Some(eff), Some(peak)) = (
        e.memory_efficiency,
        e.usage.as_ref().and_then(|u| u.memory_peak),
    ) {
        if eff < LOW && e.memory > 1 << 30 {
            let ask = (peak + peak / 2).max(64 << 20);
            out.push(format!(
                "its memory peaked at {} of the {} it asked for: --mem {} would do",
                format_memory(peak),
                format_memory(e.memory),
                format_memory(ask.next_power_of_two())
            ));
        }
    }
    if let Some(util) = e.gpu_utilization {
        if util < LOW * 100.0 {
            out.push(format!(
                "its GPUs were busy {util:.0}% of the time: the GPUs waited on something \
                 (data loading, CPU work, I/O), or it needs fewer of them"
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use wharf_api::usage::GpuUsage;

    fn eff(cpus: u32, memory: u64, usage: &JobUsage, elapsed_ms: u64) -> Vec<String> {
        let mut e = Efficiency {
            id: "1".into(),
            state: "COMPLETED",
            elapsed_ms: Some(elapsed_ms),
            cpus,
            memory,
            gpus: usage.gpus.len() as u32,
            cpu_efficiency: usage.cpu_efficiency(elapsed_ms, cpus),
            memory_efficiency: usage.memory_efficiency(memory),
            gpu_utilization: usage.gpu_util(),
            usage: Some(usage.clone()),
            hints: vec![],
        };
        e.hints = hints(&e);
        e.hints
    }

    #[test]
    fn a_running_job_has_run_until_now() {
        let owner = wharf_api::Owner {
            uid: 1000,
            gid: 1000,
            user: "ann".into(),
        };
        let res = wharf_api::Resources::default();
        let mut j = JobRecord::pending(owner, "j".into(), res, 60, 0);
        assert_eq!(efficiency(&j).elapsed_ms, None, "never started");
        j.state = wharf_api::JobState::Running;
        let start = wharf_controller::now_ms() - 5_000;
        j.start_time = Some(start);
        let ran = efficiency(&j).elapsed_ms.unwrap();
        assert!((5_000..60_000).contains(&ran), "{ran}");
        j.state = wharf_api::JobState::Completed;
        j.end_time = Some(start + 2_000);
        assert_eq!(efficiency(&j).elapsed_ms, Some(2_000));
    }

    #[test]
    fn hints_name_what_was_held_and_barely_used() {
        let idle = JobUsage {
            cpu_time_ms: Some(1_000),
            memory_peak: Some(100 << 20),
            gpus: vec![GpuUsage {
                id: 0,
                util_avg: 3,
                ..GpuUsage::default()
            }],
            ..JobUsage::default()
        };
        let h = eff(8, 32 << 30, &idle, 60_000);
        assert_eq!(h.len(), 3, "{h:?}");
        assert!(h[0].contains("--cpus 1"), "{h:?}");
        // A second of CPU in a minute is not a CPU kept busy.
        assert!(
            h[0].contains("less than one of its 8 CPUs busy (2% of one)"),
            "{h:?}"
        );
        assert!(h[1].contains("--mem 256M"), "{h:?}");
        assert!(h[2].contains("busy 3%"), "{h:?}");
        let two = JobUsage {
            cpu_time_ms: Some(110_000),
            ..JobUsage::default()
        };
        let h = eff(8, 1 << 30, &two, 60_000);
        assert!(
            h[0].contains("about 2 of its 8 CPUs busy: ask for --cpus 2"),
            "{h:?}"
        );
        let busy = JobUsage {
            cpu_time_ms: Some(470_000),
            memory_peak: Some(30 << 30),
            gpus: vec![GpuUsage {
                id: 0,
                util_avg: 95,
                ..GpuUsage::default()
            }],
            ..JobUsage::default()
        };
        assert!(eff(8, 32 << 30, &busy, 60_000).is_empty());
    }
}
