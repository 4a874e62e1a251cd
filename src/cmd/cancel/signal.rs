//! `wharf cancel --signal SIG` (scancel's `-s`): a signal for running jobs' or steps'
//! processes, which go on running unless it ends them.

use anyhow::Result;
use nix::sys::signal::Signal;
use wharf_api::signal::{Reach, SignalRequest};
use wharf_api::step::StepRecord;
use wharf_api::JobRecord;

/// Reads a signal as `kill` and scancel take one: a name with or without `SIG`, in any case
/// (`USR1`, `sigterm`), or its number (`10`).
pub fn parse(text: &str) -> Result<Signal, String> {
    let word = text.trim();
    let found = if word.bytes().all(|b| b.is_ascii_digit()) && !word.is_empty() {
        word.parse::<i32>()
            .ok()
            .and_then(|n| Signal::try_from(n).ok())
    } else {
        let upper = word.to_ascii_uppercase();
        let name = match upper.strip_prefix("SIG") {
            Some(_) => upper,
            None => format!("SIG{upper}"),
        };
        name.parse::<Signal>().ok()
    };
    found.ok_or_else(|| {
        format!(
            "{:?} is no signal: give a name, with or without SIG (USR1, SIGTERM), or a number \
             from 1 (10 is USR1); `kill -l` lists them",
            crate::output::clean(text)
        )
    })
}

/// Sends `signal` to each of `jobs` (`ID`, `ID_TASK`) and `steps` (`JOB.STEP`), printing
/// `job ID: sent SIGNAL` for each (or, with `json`, the answers at the end). Exit status 1
/// if the controller refused any.
pub async fn run(
    socket: &str,
    jobs: &[String],
    steps: &[String],
    signal: Signal,
    (batch, full): (bool, bool),
    json: bool,
) -> Result<i32> {
    let name = signal.as_str();
    let mut status = 0;
    if !steps.is_empty() {
        let body = serde_json::to_value(SignalRequest {
            signal: signal as i32,
            batch: false,
            full: false,
        })?;
        let path = |label: &str| super::step_path(label, "signal");
        let said = |_: &StepRecord| format!("sent {name}");
        status = super::post_all(socket, steps, json, "step", path, &body, said).await?;
    }
    if !jobs.is_empty() {
        let req = SignalRequest {
            signal: signal as i32,
            batch,
            full,
        };
        let body = serde_json::to_value(req)?;
        let path = |id: &str| format!("/v1/jobs/{id}/signal");
        let said = |job: &JobRecord| sent(job, name);
        let jobs_status = super::post_all(socket, jobs, json, "job", path, &body, said).await?;
        status = status.max(jobs_status);
    }
    Ok(status)
}

/// What `wharf cancel --signal` says of a job it signalled: the newest signal in its record
/// is the one just sent, and says what it reached.
fn sent(job: &JobRecord, name: &str) -> String {
    match job.signals.last().map(|s| s.reach) {
        Some(Reach::Steps) => format!(
            "sent {name} to its steps (-b for its batch script alone, -f for the script too)"
        ),
        Some(Reach::Batch) => format!("sent {name} to its batch script"),
        _ => format!("sent {name}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_with_or_without_sig_in_any_case_and_numbers_are_signals() {
        for (text, want) in [
            ("USR1", Signal::SIGUSR1),
            ("SIGUSR1", Signal::SIGUSR1),
            ("usr1", Signal::SIGUSR1),
            ("sigterm", Signal::SIGTERM),
            ("10", Signal::SIGUSR1),
            ("9", Signal::SIGKILL),
            ("KILL", Signal::SIGKILL),
            (" INT ", Signal::SIGINT),
            ("SIGSTOP", Signal::SIGSTOP),
        ] {
            assert_eq!(parse(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn unknown_names_zero_and_numbers_out_of_range_are_refused() {
        for bad in [
            "",
            "0",
            "00",
            "-1",
            "65",
            "4294967306",
            "FOO",
            "SIG",
            "SIGUSR3",
            "1.5",
        ] {
            let err = parse(bad).expect_err(bad);
            assert!(
                err.contains("is no signal") && err.contains("USR1"),
                "{err}"
            );
        }
    }

    #[test]
    fn what_is_said_follows_what_the_signal_reached() {
        let mut job = JobRecord::pending(
            wharf_api::Owner {
                uid: 1,
                gid: 1,
                user: "a".into(),
            },
            "j".into(),
            wharf_api::Resources::default(),
            60,
            0,
        );
        assert_eq!(sent(&job, "SIGUSR1"), "sent SIGUSR1");
        job.signals.push(wharf_api::signal::JobSignal {
            seq: 1,
            run: 0,
            signal: 10,
            reach: Reach::Steps,
            by: "a".into(),
        });
        assert!(sent(&job, "SIGUSR1").starts_with("sent SIGUSR1 to its steps"));
    }
}
