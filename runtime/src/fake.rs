//! A fake backend for tests: no containers, a thread per job that plays a tiny command
//! language, the same job-directory contract as the real backends, and a record of calls.
//!
//! Commands it understands (what the conformance suite uses):
//! `/bin/true`, `/bin/false`, `/bin/sh -c "exit N"`, `/bin/sleep SECONDS`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::backend::Backend;
use crate::error::{ErrorKind, RuntimeError};
use crate::jobdir::JobDir;
use crate::launcher::JobStatus;
use crate::spec::{ContainerSpec, Outcome};

/// What the fake was asked to do, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FakeCall {
    /// `launch` of this container id.
    Launch(String),
    /// `cancel` of this directory.
    Cancel(std::path::PathBuf),
    /// `remove` of this directory.
    Remove(std::path::PathBuf),
    /// `signals_requested` of this directory.
    SignalsRequested(std::path::PathBuf),
}

#[derive(Debug, Default)]
struct Job {
    dir: std::path::PathBuf,
    cancel: Arc<AtomicBool>,
    done: Arc<AtomicBool>,
}

/// The fake backend.
#[derive(Debug, Default)]
pub struct FakeBackend {
    calls: Mutex<Vec<FakeCall>>,
    jobs: Mutex<Vec<Job>>,
}

impl FakeBackend {
    /// A fake with no jobs.
    pub fn new() -> Self {
        Self::default()
    }

    /// The calls so far.
    pub fn calls(&self) -> Vec<FakeCall> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn job(&self, dir: &JobDir) -> Option<(Arc<AtomicBool>, Arc<AtomicBool>)> {
        let jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        // The latest launch into a directory is the one it holds.
        jobs.iter()
            .rfind(|j| j.dir == dir.path())
            .map(|j| (j.cancel.clone(), j.done.clone()))
    }
}

/// What a command does: run this long, then exit with this code.
fn plan(argv: &[String]) -> Result<(Duration, i32), String> {
    let words: Vec<&str> = argv.iter().map(String::as_str).collect();
    match words.as_slice() {
        ["/bin/true"] => Ok((Duration::ZERO, 0)),
        ["/bin/false"] => Ok((Duration::ZERO, 1)),
        ["/bin/sh", "-c", script] => match script
            .strip_prefix("exit ")
            .and_then(|n| n.trim().parse().ok())
        {
            Some(code) => Ok((Duration::ZERO, code)),
            None => Err(format!("fake backend cannot run script {script:?}")),
        },
        ["/bin/sleep", secs] => secs
            .parse::<f64>()
            .map(|s| (Duration::from_secs_f64(s), 0))
            .map_err(|_| format!("bad sleep {secs}")),
        _ => Err(format!("fake backend cannot run {argv:?}")),
    }
}

impl Backend for FakeBackend {
    fn name(&self) -> &'static str {
        "fake"
    }

    fn signals_requested(&self, dir: &JobDir) {
        self.calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(FakeCall::SignalsRequested(dir.path().to_path_buf()));
    }

    fn launch(&self, dir: &JobDir, spec: &ContainerSpec) -> Result<(), RuntimeError> {
        self.calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(FakeCall::Launch(spec.id.clone()));
        dir.create(spec)?;
        let (cancel, done) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        self.jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Job {
                dir: dir.path().to_path_buf(),
                cancel: cancel.clone(),
                done: done.clone(),
            });
        let (jd, spec) = (dir.clone(), spec.clone());
        std::thread::spawn(move || {
            let started = Instant::now();
            let mut out = Outcome {
                started_ms: Some(crate::now_ms()),
                ..Default::default()
            };
            match plan(&spec.argv) {
                Err(e) => {
                    out.started_ms = None;
                    out.error = Some(e);
                }
                Ok((runs, code)) => {
                    let limit = spec.time_limit.map(Duration::from_secs);
                    loop {
                        let t = started.elapsed();
                        if cancel.load(Ordering::SeqCst) {
                            (out.cancelled, out.signal) = (true, Some(libc::SIGTERM));
                            break;
                        }
                        if limit.is_some_and(|l| t >= l) && t < runs {
                            (out.timed_out, out.signal) = (true, Some(libc::SIGTERM));
                            break;
                        }
                        if t >= runs {
                            out.exit_code = Some(code);
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
            }
            out.ended_ms = crate::now_ms();
            let _ = JobDir::write_atomic(&jd.outcome(), &out);
            done.store(true, Ordering::SeqCst);
        });
        Ok(())
    }

    fn status(&self, dir: &JobDir) -> JobStatus {
        if let Some(o) = dir.read_outcome() {
            return JobStatus::Exited(o);
        }
        match self.job(dir) {
            Some((_, done)) if !done.load(Ordering::SeqCst) => JobStatus::Running {
                pid: 0,
                started_ms: Some(crate::now_ms()),
            },
            _ => JobStatus::Lost("the fake backend has no such running job".into()),
        }
    }

    fn cancel(&self, dir: &JobDir) -> Result<(), RuntimeError> {
        self.calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(FakeCall::Cancel(dir.path().to_path_buf()));
        if let Some((cancel, _)) = self.job(dir) {
            cancel.store(true, Ordering::SeqCst);
        }
        Ok(())
    }

    fn remove(&self, dir: &JobDir) -> Result<(), RuntimeError> {
        self.calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(FakeCall::Remove(dir.path().to_path_buf()));
        if matches!(self.status(dir), JobStatus::Running { .. }) {
            return Err(RuntimeError::new(
                ErrorKind::InvalidInput,
                "job still running",
            ));
        }
        match std::fs::remove_dir_all(dir.path()) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(RuntimeError::io(dir.path().display(), e))
            }
            _ => {
                // Forgotten with its directory, so a later look finds no job there.
                self.jobs
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .retain(|j| j.dir != dir.path());
                Ok(())
            }
        }
    }
}
