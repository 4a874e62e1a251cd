//! The side-by-side table of policies, for people (`render`) and machines (`--json`).

use comfy_table::{presets::UTF8_FULL_CONDENSED, Cell, CellAlignment, Table};
use serde::Serialize;

use crate::driver::{Estimates, Policy};
use crate::metrics::{Metrics, Outcome};
use crate::workload::Workload;

/// One policy's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Column {
    /// The policy.
    pub policy: Policy,
    /// Its metrics.
    pub metrics: Metrics,
    /// Jobs never started: refused at submit as the controller refuses a job that could never
    /// run, or never placed by the core (none unless a job could never fit).
    pub never_started: usize,
    /// Scheduling passes.
    pub passes: u64,
    /// Times a still-pending job lost its reservation.
    pub reservations_dropped: u64,
    /// How good the estimated starts were.
    pub estimates: Estimates,
    /// Wall-clock seconds the replay took.
    pub wall_s: f64,
}

/// A whole comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The workload's description.
    pub workload: String,
    /// Seed.
    pub seed: u64,
    /// Jobs in the workload, and trace jobs left out.
    pub jobs: usize,
    /// Trace jobs left out (no run time or processors, or wider than the machine).
    pub skipped: usize,
    /// One column per policy.
    pub columns: Vec<Column>,
}

/// The human table: one row per metric, one column per policy, and Wharf against EASY.
pub fn render(report: &Report) -> String {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    let mut header = vec![Cell::new("metric")];
    header.extend(report.columns.iter().map(|c| Cell::new(c.policy)));
    let easy = report.columns.iter().find(|c| c.policy == Policy::Easy);
    let wharf = report.columns.iter().find(|c| c.policy == Policy::Wharf);
    let ratio = easy.is_some() && wharf.is_some();
    if ratio {
        header.push(Cell::new("wharf/easy"));
    }
    t.set_header(header);
    type Get = fn(&Column) -> f64;
    let rows: [(&str, Get, usize); 16] = [
        ("jobs finished", |c| c.metrics.jobs as f64, 0),
        ("utilization", |c| c.metrics.utilization, 4),
        (
            "utilization (arrival span)",
            |c| c.metrics.utilization_arrivals,
            4,
        ),
        ("mean wait (s)", |c| c.metrics.mean_wait_s, 1),
        (
            "mean bounded slowdown",
            |c| c.metrics.mean_bounded_slowdown,
            3,
        ),
        ("max wait (s)", |c| c.metrics.max_wait_s, 0),
        (
            "Jain fairness (usage/entitled)",
            |c| c.metrics.jain_fairness,
            4,
        ),
        (
            "Jain of acct mean BSLD",
            |c| c.metrics.jain_bounded_slowdown,
            4,
        ),
        ("never started", |c| c.never_started as f64, 0),
        ("passes", |c| c.passes as f64, 0),
        ("reservations dropped", |c| c.reservations_dropped as f64, 0),
        ("started after an estimate", |c| c.estimates.jobs as f64, 0),
        ("started by first estimate", |c| c.estimates.on_time, 3),
        ("estimate error p50 (s)", |c| c.estimates.median_error_s, 0),
        ("estimate error p90 (s)", |c| c.estimates.p90_error_s, 0),
        ("replay wall (s)", |c| c.wall_s, 2),
    ];
    for (name, get, digits) in rows {
        let mut row = vec![Cell::new(name)];
        row.extend(report.columns.iter().map(|c| {
            Cell::new(format!("{:.*}", digits, get(c))).set_alignment(CellAlignment::Right)
        }));
        if let (Some(e), Some(w)) = (easy, wharf) {
            let text = if get(e) == 0.0 || name == "replay wall (s)" {
                String::new()
            } else {
                format!("{:.3}", get(w) / get(e))
            };
            row.push(Cell::new(text).set_alignment(CellAlignment::Right));
        }
        t.add_row(row);
    }
    let mut out = format!(
        "{}\n{} jobs (seed {}, {} trace jobs skipped)\n{t}\n",
        report.workload, report.jobs, report.seed, report.skipped
    );
    for c in &report.columns {
        let per: Vec<String> = c
            .metrics
            .account_bounded_slowdown
            .iter()
            .map(|(a, x)| format!("{a}={x:.2}"))
            .collect();
        let ratio: Vec<String> = c
            .metrics
            .account_usage_ratio
            .iter()
            .map(|(a, x)| format!("{a}={x:.3}"))
            .collect();
        out.push_str(&format!(
            "{:>5} per account: BSLD {} | usage/entitled {}\n",
            c.policy,
            per.join(" "),
            ratio.join(" ")
        ));
    }
    out
}

/// The finished jobs of one replay as CSV, one line per job in the order they ended: id, its
/// account's name, user index, submit, start and end (ms of the workload's clock), resource
/// units held (processors or GPUs) and time limit (ms).
pub fn outcomes_csv(workload: &Workload, done: &[Outcome]) -> String {
    use std::fmt::Write as _;
    let jobs: std::collections::BTreeMap<u64, &crate::workload::SimJob> =
        workload.jobs.iter().map(|j| (j.id, j)).collect();
    // Each account's name as a CSV field, once: a name with a comma or quote is quoted, as
    // CSV readers expect.
    let names: Vec<std::borrow::Cow<str>> = workload
        .accounts
        .iter()
        .map(|a| match a.name.contains([',', '"', '\n']) {
            true => format!("\"{}\"", a.name.replace('"', "\"\"")).into(),
            false => a.name.as_str().into(),
        })
        .collect();
    let mut out = String::from("id,account,user,submit_ms,start_ms,end_ms,units,limit_ms\n");
    for o in done {
        let account = names.get(o.account as usize).map_or("", |n| n.as_ref());
        let (user, limit) = jobs.get(&o.id).map_or((0, 0), |j| (j.user, j.limit));
        // Writing to a String cannot fail.
        let _ = writeln!(
            out,
            "{},{account},{user},{},{},{},{},{limit}",
            o.id, o.submit, o.start, o.end, o.units
        );
    }
    out
}
