//! What each caller may see of a job. Its owner and admins see all of it; other users see
//! its public fields (name, owner, resources, state, times, node, priority, expected start,
//! exit status, and in the queue listing's rows its partition) and a reason rebuilt from them, never the spec (command, environment, paths),
//! words that came from it, or what it used (its CPU time, memory and GPU use, which `wharf
//! eff` reads).

use wharf_api::listing::JobRow;
use wharf_api::{JobRecord, JobState, PullProgress, Stop};

use crate::cluster::Caller;

/// Hides the private parts (command, environment, paths) of other users' jobs. Their reason
/// is rebuilt from public fields only ([`public_reason`]): the stored one may quote the
/// agent's words about the job's command, files or mounts.
pub fn view(caller: &Caller, mut job: JobRecord) -> JobRecord {
    if !caller.may_manage(&job) {
        job.spec = None;
        // The image it pulls is the spec's.
        job.pulling.clear();
        job.requeued_message = None;
        // Which signals its owner sends their job, and when, are theirs too.
        job.signals.clear();
        let ranks = job.allocs.iter_mut().filter_map(|a| a.exit.as_mut());
        for exit in job.exit.as_mut().into_iter().chain(ranks) {
            exit.message = None;
            exit.usage = None;
        }
        // A step's command and words are its owner's, as the job's are.
        for step in &mut job.steps {
            step.name.clear();
            step.stop = None;
            step.argv.clear();
            step.env.clear();
            step.workdir = None;
            let nodes = step.nodes.iter_mut().filter_map(|n| n.exit.as_mut());
            for exit in step.exit.as_mut().into_iter().chain(nodes) {
                exit.message = None;
                exit.usage = None;
            }
        }
        job.reason = public_reason(&job);
    }
    if job.state != JobState::Pending {
        job.pending_reason = None;
    }
    job
}

/// The listing row of `job` as `caller` may see it: what [`view`] leaves of it, borrowed from
/// it. `pulls` are its nodes' pulls of its image, which only its owner and admins see. (A
/// row's reason is a pending job's, which [`public_reason`] keeps as it is.)
/// `partition` is the job's (its spec's, else the default), which everyone sees, as squeue
/// shows it.
pub fn row<'a>(
    caller: &Caller,
    job: &'a JobRecord,
    pulls: &[PullProgress],
    partition: &'a str,
) -> JobRow<'a> {
    let pulls = if caller.may_manage(job) { pulls } else { &[] };
    JobRow {
        partition: std::borrow::Cow::Borrowed(partition),
        ..JobRow::of(job, pulls)
    }
}

/// The reason of `job` as users other than its owner see it: made of its state, resources,
/// node and exit status, never of text that came from its spec or its node.
pub fn public_reason(job: &JobRecord) -> Option<String> {
    let exit = job.exit.clone().unwrap_or_default();
    match job.state {
        // The scheduler's words ([`wharf_core::PendingReason`]), made from resources alone.
        JobState::Pending => job.reason.clone(),
        JobState::Starting if job.allocs.is_empty() => Some("starting".into()),
        JobState::Starting => Some(format!("starting on {}", job.nodelist())),
        JobState::Running if job.cancel_requested => Some("cancel requested; stopping".into()),
        JobState::Running if job.stop.is_some() => {
            job.stop.as_ref().map(|s| format!("{s}; stopping"))
        }
        JobState::Running | JobState::Completed => None,
        // A gang rank's failure: which rank on which node is public, its words are not.
        JobState::Failed if matches!(job.stop, Some(Stop::RankFailed { .. })) => job
            .stop
            .as_ref()
            .map(|s| format!("{s}: exit {}", exit.code_signal())),
        JobState::Failed if exit.code.is_none() && exit.signal.is_none() => {
            Some("could not start (the details are shown to its owner and admins only)".into())
        }
        JobState::Failed => Some(format!("exit {}", exit.code_signal())),
        JobState::Cancelled => Some("cancelled".into()),
        JobState::Timeout | JobState::OutOfMemory => ended_reason(job),
        JobState::Preempted => Some(match &job.stop {
            Some(s) => s.to_string(),
            None => "preempted".into(),
        }),
        JobState::NodeFail => Some(match (&job.stop, job.first_node()) {
            (Some(stop @ (Stop::NodeLost { .. } | Stop::LaunchFault { .. })), _) => {
                stop.to_string()
            }
            (_, Some(n)) => format!("node {n} failed or lost the job"),
            (_, None) => "its node failed".into(),
        }),
    }
}

/// Why a job that hit a limit ended, from its public limits.
pub fn ended_reason(job: &JobRecord) -> Option<String> {
    match job.state {
        JobState::OutOfMemory => Some(format!(
            "killed by the kernel for using more than its {} memory limit",
            wharf_api::resources::format_memory(job.resources.memory)
        )),
        JobState::Timeout => Some(format!(
            "killed at its time limit of {}",
            wharf_api::resources::format_duration(job.time_limit)
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wharf_api::{ExitInfo, Owner, Resources};

    fn used() -> wharf_api::usage::JobUsage {
        wharf_api::usage::JobUsage {
            cpu_time_ms: Some(1234),
            memory_peak: Some(1 << 29),
            ..Default::default()
        }
    }

    fn failed(message: &str, code: Option<i32>) -> JobRecord {
        let owner = Owner {
            uid: 1000,
            gid: 1000,
            user: "alice".into(),
        };
        let resources = Resources {
            cpus: 1,
            memory: 1 << 30,
            gpus: 0,
        };
        JobRecord {
            id: 3,
            state: JobState::Failed,
            reason: Some(message.into()),
            end_time: Some(2),
            allocs: vec![wharf_api::NodeAlloc {
                exit: Some(ExitInfo {
                    code,
                    message: Some(message.into()),
                    usage: Some(used()),
                    ..Default::default()
                }),
                ..wharf_api::NodeAlloc::new("n1", vec![0], vec![])
            }],
            exit: Some(ExitInfo {
                code,
                message: Some(message.into()),
                usage: Some(used()),
                ..Default::default()
            }),
            ..JobRecord::pending(owner, "train".into(), resources, 60, 1)
        }
    }

    fn caller(uid: u32, admin: bool) -> Caller {
        Caller {
            owner: Owner {
                uid,
                gid: uid,
                user: uid.to_string(),
            },
            admin,
        }
    }

    #[test]
    fn others_see_no_words_from_the_job_or_its_node_nor_what_it_used() {
        let secret = "cannot create output file /home/alice/secret/out as uid 1000";
        for code in [None, Some(3)] {
            let seen = view(&caller(1001, false), failed(secret, code));
            let reason = seen.reason.unwrap_or_default();
            assert!(!reason.contains("secret") && !reason.is_empty(), "{reason}");
            let exit = seen.exit.unwrap();
            assert_eq!((exit.message, exit.usage, exit.code), (None, None, code));
            let rank = seen.allocs[0].exit.as_ref().unwrap();
            assert_eq!((&rank.message, &rank.usage), (&None, &None));
        }
        for who in [caller(1000, false), caller(1001, true)] {
            let seen = view(&who, failed(secret, None));
            assert_eq!(seen.reason.as_deref(), Some(secret));
            assert_eq!(seen.exit.unwrap().usage, Some(used()));
        }
    }
}
