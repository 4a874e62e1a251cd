use super::*;
use std::io::Read;

use wharf_runtime::fake::FakeBackend;

/// A step task's directory with its input FIFO, and the shim's reader on it.
/// One round of the pump for `t`, as `spawn` runs it: its end read, then its pipe moved on.
fn advance(t: &mut Task, launcher: &dyn Backend) {
    let ended = has_ended(t, launcher);
    step(t, ended);
}

fn task_with_pipe(root: &std::path::Path) -> (Task, std::fs::File) {
    let dir = JobDir::new(root.join("7.s0.0"));
    std::fs::create_dir_all(dir.input_dir()).unwrap();
    nix::unistd::mkfifo(
        &dir.stdin_pipe(),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let mut task = Task {
        dir: dir.clone(),
        key: StepKey { job: 7, step: 0 },
        local: 0,
        pipe: Pipe::Opening,
    };
    // Nobody reads it yet (the shim has not opened it): the agent waits.
    advance(&mut task, &FakeBackend::new());
    assert!(matches!(task.pipe, Pipe::Opening));
    assert!(!dir.stdin_ready().exists());
    let reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(dir.stdin_pipe())
        .unwrap();
    (task, reader)
}

#[test]
fn the_pump_opens_the_pipe_writes_what_came_and_closes_it_at_the_end() {
    let root = tempfile::tempdir().unwrap();
    let (mut t, mut reader) = task_with_pipe(root.path());
    let fake = FakeBackend::new();
    advance(&mut t, &fake);
    assert!(matches!(t.pipe, Pipe::Open { .. }), "{:?}", t.pipe);
    assert!(t.dir.stdin_ready().exists(), "the shim is told");
    if let Pipe::Open { pending, eof, .. } = &mut t.pipe {
        pending.extend_from_slice(b"a\nb\n");
        *eof = true;
    }
    advance(&mut t, &fake);
    assert!(
        matches!(
            t.pipe,
            Pipe::Closed {
                offset: 4,
                told: false
            }
        ),
        "{:?}",
        t.pipe
    );
    let mut text = String::new();
    reader.read_to_string(&mut text).unwrap();
    assert_eq!(text, "a\nb\n", "then the end: read_to_string returned");
}

#[test]
fn a_task_that_does_not_read_holds_the_rest_back_and_one_that_closed_is_let_go() {
    let root = tempfile::tempdir().unwrap();
    let (mut t, reader) = task_with_pipe(root.path());
    let fake = FakeBackend::new();
    advance(&mut t, &fake);
    // More than the pipe holds: what it does not take stays pending, nothing is lost.
    let big = vec![b'x'; 4 << 20];
    if let Pipe::Open { pending, .. } = &mut t.pipe {
        pending.extend_from_slice(&big);
    }
    advance(&mut t, &fake);
    let Pipe::Open {
        offset, pending, ..
    } = &t.pipe
    else {
        panic!("{:?}", t.pipe)
    };
    assert!(*offset > 0 && *offset < big.len() as u64, "{offset}");
    assert_eq!(*offset as usize + pending.len(), big.len());
    // The task closes its input (`head -1`): the pipe is closed, the controller to be told.
    drop(reader);
    advance(&mut t, &fake);
    assert!(
        matches!(t.pipe, Pipe::Closed { told: false, .. }),
        "{:?}",
        t.pipe
    );
}

#[test]
fn only_step_tasks_that_take_input_are_pumped_and_a_restart_leaves_theirs_closed() {
    let root = tempfile::tempdir().unwrap();
    let jobs = root.path();
    let mut spec = wharf_runtime::conformance::template("wharf-7.s0.0", jobs, 1, 1);
    let make = |name: &str, spec: &wharf_runtime::ContainerSpec| {
        JobDir::new(jobs.join(name)).create(spec).unwrap();
    };
    make("7.s0.1", &spec);
    make("7", &spec);
    spec.capture_stdin = true;
    make("7.s0.0", &spec);
    make("7.s1.0", &spec);
    // Step 1's task had its pipe opened by an agent before this one.
    let restarted = JobDir::new(jobs.join("7.s1.0"));
    std::fs::create_dir(restarted.input_dir()).unwrap();
    std::fs::write(restarted.stdin_ready(), b"").unwrap();
    let mut tasks = BTreeMap::new();
    find_tasks(jobs, &mut tasks);
    let seen: Vec<(String, Option<bool>)> = tasks
        .iter()
        .map(|(p, t)| {
            let name = p.file_name().unwrap().to_str().unwrap().to_string();
            (name, t.as_ref().map(|t| matches!(t.pipe, Pipe::Opening)))
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("7.s0.0".to_string(), Some(true)),
            ("7.s0.1".to_string(), None),
            ("7.s1.0".to_string(), Some(false)),
        ]
    );
}
