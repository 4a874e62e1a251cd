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

fn input(offset: u64, data: &[u8], eof: bool) -> InputLine {
    InputLine {
        offset,
        data: data.to_vec(),
        eof,
    }
}

/// The next push's offset, bytes, end and the offset held from.
fn pushed(o: &Outbox) -> Option<(u64, Vec<u8>, bool, u64)> {
    o.next().map(|(l, from)| (l.offset, l.data, l.eof, from))
}

fn ack(next: u64, held_from: Option<u64>) -> InputAck {
    InputAck { next, held_from }
}

#[test]
fn the_outbox_keeps_what_the_tasks_do_not_have_yet_and_gives_it_again_to_a_restarted_controller() {
    let mut o = Outbox::default();
    o.add(input(0, b"abc", false));
    assert_eq!(pushed(&o), Some((0, b"abc".to_vec(), false, 0)));
    assert!(o.acked(&input(0, b"abc", false), ack(3, Some(0))));
    assert_eq!(
        pushed(&o),
        None,
        "all taken: the caller's next line is read"
    );
    o.add(input(3, b"de", false));
    assert_eq!(pushed(&o), Some((3, b"de".to_vec(), false, 0)));
    // The tasks have "ab": that much is forgotten.
    assert!(o.acked(&input(3, b"de", false), ack(5, Some(2))));
    assert_eq!((o.from, o.data.len()), (2, 3));
    o.add(input(5, b"fg", false));
    assert_eq!(pushed(&o), Some((5, b"fg".to_vec(), false, 2)));
    // The controller restarted and lost "cde": it asks from 2, and gets it all again.
    assert!(o.acked(&input(5, b"fg", false), ack(2, Some(2))));
    assert_eq!(pushed(&o), Some((2, b"cdefg".to_vec(), false, 2)));
    assert!(o.acked(&input(2, b"cdefg", false), ack(7, Some(2))));
    assert_eq!(pushed(&o), None);
    // A full buffer takes part and moves on; one that takes nothing moves nothing.
    o.add(input(7, b"hij", false));
    assert!(o.acked(&input(7, b"hij", false), ack(8, Some(2))));
    assert_eq!(pushed(&o), Some((8, b"ij".to_vec(), false, 2)));
    assert!(!o.acked(&input(8, b"ij", false), ack(8, Some(2))));
}

#[test]
fn after_the_end_the_outbox_asks_until_every_task_has_it() {
    let mut o = Outbox::default();
    o.add(input(0, b"x", true));
    assert_eq!(pushed(&o), Some((0, b"x".to_vec(), true, 0)));
    assert!(o.acked(&input(0, b"x", true), ack(1, Some(0))));
    // Taken, not yet read: an empty push at the end asks again.
    assert_eq!(pushed(&o), Some((1, vec![], true, 0)));
    assert!(!o.acked(&input(1, b"", true), ack(1, Some(0))));
    // A restarted controller lost it: asked for again, end and all.
    assert!(o.acked(&input(1, b"", true), ack(0, Some(0))));
    assert_eq!(pushed(&o), Some((0, b"x".to_vec(), true, 0)));
    assert!(o.acked(&input(0, b"x", true), ack(1, Some(0))));
    // The task has the byte, not yet the end: still asked.
    assert!(o.acked(&input(1, b"", true), ack(1, Some(1))));
    assert_eq!(pushed(&o), Some((1, vec![], true, 1)));
    // One past the end: every task has the end too.
    assert!(o.acked(&input(1, b"", true), ack(1, Some(2))));
    assert_eq!(pushed(&o), None);
}

#[test]
fn input_refused_for_good_is_dropped_and_counts_as_had() {
    let mut o = Outbox::default();
    o.add(input(0, b"abc", true));
    o.drop_all();
    assert_eq!(pushed(&o), None);
    assert!(o.taken());
}

#[test]
fn a_controller_that_does_not_say_what_its_tasks_have_is_answered_as_before() {
    // A full buffer takes part: the rest is pushed from where it stopped, nothing skipped.
    let mut o = Outbox::default();
    o.add(input(0, b"abcd", false));
    assert!(o.acked(&input(0, b"abcd", false), ack(2, None)));
    assert_eq!(pushed(&o), Some((2, b"cd".to_vec(), false, 2)));
    let mut o = Outbox::default();
    o.add(input(0, b"abc", false));
    assert!(o.acked(&input(0, b"abc", false), ack(3, None)));
    assert!(o.data.is_empty(), "what it took is forgotten");
    o.add(input(3, b"", true));
    assert_eq!(pushed(&o), Some((3, vec![], true, 3)));
    assert!(o.acked(&input(3, b"", true), ack(3, None)));
    assert_eq!(pushed(&o), None);
}

#[test]
fn one_push_carries_a_bounded_part() {
    let mut o = Outbox::default();
    let big = vec![b'x'; PUSH_BYTES + 10];
    o.add(input(0, &big, false));
    let (at, data, _, _) = pushed(&o).unwrap();
    assert_eq!((at, data.len()), (0, PUSH_BYTES));
    assert!(o.acked(&input(0, &data, false), ack(PUSH_BYTES as u64, Some(0))));
    assert_eq!(pushed(&o).unwrap().1.len(), 10);
}
