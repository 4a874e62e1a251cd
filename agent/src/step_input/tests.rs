use super::*;
use std::borrow::Borrow;
use std::io::Read;

use wharf_runtime::fake::FakeBackend;

/// A step task's directory with its input FIFO, and the shim's reader on it.
/// One round of the pump for `t`, as `spawn` runs it: its end read, then its pipe moved on.
fn advance(t: &mut Task, launcher: &dyn Backend) {
    let ended = has_ended(t, launcher);
    step(t, ended, launcher);
}

/// `t`'s pipe is closed after `at` bytes, the controller not told yet.
fn assert_closed_untold(t: &Task, at: u64) {
    assert!(
        matches!(t.pipe, Pipe::Closed { offset, told: false } if offset == at),
        "{:?}",
        t.pipe
    );
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
        pipe: Pipe::Opening { resume: None },
    };
    // Nobody reads it yet (the shim has not opened it): the agent waits.
    advance(&mut task, &FakeBackend::new());
    assert!(matches!(task.pipe, Pipe::Opening { resume: None }));
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
    assert!(t.dir.stdin_hold().exists(), "and that it may hold a writer");
    if let Pipe::Open { pending, eof, .. } = &mut t.pipe {
        pending.extend_from_slice(b"a\nb\n");
        *eof = true;
    }
    advance(&mut t, &fake);
    assert_closed_untold(t.borrow(), 4);
    let mut text = String::new();
    reader.read_to_string(&mut text).unwrap();
    assert_eq!(text, "a\nb\n", "then the end: read_to_string returned");
    assert_eq!(written_before(&t.dir), 4, "what was written is counted");
    assert!(t.dir.stdin_end().exists(), "the shim is told to let go");
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
fn only_step_tasks_that_take_input_are_pumped_and_a_restart_goes_on_from_what_was_written() {
    let root = tempfile::tempdir().unwrap();
    let jobs = root.path();
    let mut spec = wharf_runtime::conformance::template("wharf-7.s0.0", jobs, 1, 1);
    let make = |name: &str, spec: &wharf_runtime::ContainerSpec| {
        JobDir::new(jobs.join(name)).create(spec).unwrap();
    };
    make("7.s0.1", &spec);
    make("7", &spec);
    spec.capture_stdin = true;
    for name in ["7.s0.0", "7.s1.0", "7.s2.0", "7.s3.0", "7.s4.0"] {
        make(name, &spec);
    }
    // Steps 1 to 3 had their pipes opened by an agent before this one, which wrote 2 bytes
    // into each; it wrote step 2's end, and step 3's task took no more.
    let earlier = |name: &str| {
        let dir = JobDir::new(jobs.join(name));
        std::fs::create_dir(dir.input_dir()).unwrap();
        std::fs::write(dir.stdin_ready(), b"").unwrap();
        std::fs::write(dir.stdin_held(), b"").unwrap();
        std::fs::write(dir.stdin_written(), format!("{:020}", 2)).unwrap();
        dir
    };
    let resumed = earlier("7.s1.0");
    std::fs::write(earlier("7.s2.0").stdin_end(), b"").unwrap();
    std::fs::write(earlier("7.s3.0").stdin_closed(), b"").unwrap();
    // Step 4's shim held no writer (it was from before that): its task read its end.
    std::fs::remove_file(earlier("7.s4.0").stdin_held()).unwrap();
    let mut tasks = BTreeMap::new();
    find_tasks(jobs, &mut tasks);
    let seen: Vec<(String, Option<String>)> = tasks
        .iter()
        .map(|(p, t)| {
            let name = p.file_name().unwrap().to_str().unwrap().to_string();
            (name, t.as_ref().map(|t| format!("{:?}", t.pipe)))
        })
        .collect();
    let s = |n: &str, p: Option<&str>| (n.to_string(), p.map(str::to_string));
    assert_eq!(
        seen,
        [
            s("7.s0.0", Some("Opening { resume: None }")),
            s("7.s0.1", None),
            s("7.s1.0", Some("Opening { resume: Some(2) }")),
            s("7.s2.0", Some("Closed { offset: 2, told: false }")),
            s("7.s3.0", Some("Closed { offset: 2, told: true }")),
            s("7.s4.0", Some("Closed { offset: 2, told: false }")),
        ]
    );
    // Step 4's end is written: a shim of now that took its writer after the agent went
    // lets it go, and its task reads its end rather than wait for ever.
    let dir = |name: &str| JobDir::new(jobs.join(name));
    assert!(dir("7.s4.0").stdin_end().exists());
    assert!(!dir("7.s3.0").stdin_end().exists(), "told: nothing to end");
    // The resumed pipe: its task still reads (the shim's reader), so it is opened again at
    // the count, without telling the shim twice; then the task closes its input.
    nix::unistd::mkfifo(
        &resumed.stdin_pipe(),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let mut reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(resumed.stdin_pipe())
        .unwrap();
    std::fs::remove_file(resumed.stdin_ready()).unwrap();
    let fake = FakeBackend::new();
    let t = tasks
        .values_mut()
        .flatten()
        .find(|t| t.dir.path() == resumed.path())
        .unwrap();
    advance(t, &fake);
    let Pipe::Open {
        offset, pending, ..
    } = &mut t.pipe
    else {
        panic!("{:?}", t.pipe)
    };
    assert_eq!(*offset, 2);
    assert!(
        !resumed.stdin_ready().exists(),
        "the shim started the task already"
    );
    pending.extend_from_slice(b"cd");
    advance(t, &fake);
    let mut got = [0u8; 2];
    reader.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"cd");
    assert_eq!(written_before(&resumed), 4);
    // Reopened after the task closed its input: closed at the count, not at 0.
    drop(reader);
    t.pipe = Pipe::Opening { resume: Some(4) };
    advance(t, &fake);
    assert_closed_untold(t.borrow(), 4);
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
