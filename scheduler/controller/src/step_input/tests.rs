use super::*;
use wharf_api::step_input::MAX_OFFSET;

const KEY: StepKey = StepKey { job: 7, step: 0 };

fn line(offset: u64, data: &[u8], eof: bool) -> InputLine {
    InputLine {
        offset,
        data: data.to_vec(),
        eof,
    }
}

fn at(task: u32, offset: u64) -> TaskInput {
    TaskInput {
        task,
        offset,
        closed: false,
    }
}

fn got(b: &InputBatch) -> Vec<(u32, u64, &[u8], bool)> {
    b.chunks
        .iter()
        .map(|c| (c.task, c.offset, c.data.as_slice(), c.eof))
        .collect()
}

#[test]
fn input_reaches_only_the_tasks_that_take_it_once_and_then_its_end() {
    let mut r = InputRelay::default();
    // Rank 0 takes input (srun's default); two tasks per node.
    let ranks = [0];
    assert_eq!(
        r.push(KEY, &ranks, line(0, b"a\n", false), None, true, 1)
            .next,
        2
    );
    // Sent again (the caller's agent retried) with more: only the new bytes are taken.
    let ack = r.push(KEY, &ranks, line(0, b"a\nb\n", true), None, true, 2);
    assert_eq!(ack.next, 4);
    // Node 0 asks for both its tasks: only rank 0 gets anything, with the end.
    let b = r.pull(KEY, &ranks, 0, 2, vec![at(0, 0), at(1, 0)], true, 3);
    assert_eq!(got(&b), [(0, 0, &b"a\nb\n"[..], true)]);
    // Node 1 (ranks 2 and 3) gets nothing: no task of its takes input.
    let b = r.pull(KEY, &ranks, 2, 2, vec![at(0, 0), at(1, 0)], true, 4);
    assert!(b.chunks.is_empty());
    // A task index past the node's tasks does not reach another node's rank.
    let b = r.pull(KEY, &ranks, 2, 2, vec![at(u32::MAX - 1, 0)], true, 4);
    assert!(b.chunks.is_empty());
    // Written into the task: the buffer lets it go.
    assert_eq!(r.held(), 4);
    let b = r.pull(KEY, &ranks, 0, 2, vec![at(0, 4)], true, 5);
    assert_eq!(got(&b), [(0, 4, &b""[..], true)]);
    assert_eq!(r.held(), 0);
}

#[test]
fn a_task_that_does_not_read_holds_its_caller_back_within_the_bound() {
    let mut r = InputRelay::default();
    let ranks = [0, 1];
    let block = vec![b'x'; 64 << 10];
    let mut offset = 0;
    // The caller pushes on and on; nothing is pulled: the buffer stops at its bound.
    for now in 0..100 {
        let ack = r.push(KEY, &ranks, line(offset, &block, false), None, true, now);
        assert!(ack.next >= offset);
        offset = ack.next;
    }
    assert_eq!(offset, STEP_BYTES as u64);
    assert_eq!(r.held(), STEP_BYTES);
    // Rank 0 reads it all; rank 1 does not: everything stays for rank 1.
    let b = r.pull(KEY, &ranks, 0, 2, vec![at(0, STEP_BYTES as u64)], true, 100);
    assert!(b.chunks.is_empty());
    assert_eq!(r.held(), STEP_BYTES);
    let ack = r.push(KEY, &ranks, line(offset, &block, false), None, true, 101);
    assert_eq!(ack.next, offset, "full: nothing taken");
    // Rank 1 reads half: room for half.
    let half = STEP_BYTES as u64 / 2;
    let b = r.pull(KEY, &ranks, 0, 2, vec![at(1, half)], true, 102);
    assert_eq!(got(&b)[0].1, half);
    assert_eq!(got(&b)[0].2.len(), PULL_BYTES);
    assert_eq!(r.held(), STEP_BYTES / 2);
    // Rank 1 closes its input: it holds nothing back any more.
    let closed = TaskInput {
        task: 1,
        offset: half,
        closed: true,
    };
    r.pull(KEY, &ranks, 0, 2, vec![closed], true, 103);
    assert_eq!(r.held(), 0);
    // Recorded as its node's polls record it: a buffer made again counts it out too.
    assert!(r.knows_closed(KEY));
}

#[test]
fn input_after_every_reader_closed_or_the_step_ended_is_dropped() {
    let mut r = InputRelay::default();
    let ranks = [0];
    r.push(KEY, &ranks, line(0, b"abc", false), None, true, 1);
    let closed = TaskInput {
        task: 0,
        offset: 1,
        closed: true,
    };
    r.pull(KEY, &ranks, 0, 1, vec![closed], true, 2);
    // The caller is not held back by a task that stopped reading (`head -1`).
    let big = vec![b'y'; 2 * STEP_BYTES];
    let ack = r.push(KEY, &ranks, line(3, &big, false), None, true, 3);
    assert_eq!(ack.next, 3 + big.len() as u64);
    assert_eq!(r.held(), 0);
    // A step that is over: dropped, and the pulling tasks are told their input ended.
    let other = StepKey { job: 7, step: 1 };
    r.push(other, &ranks, line(0, b"abc", false), None, true, 4);
    assert_eq!(r.held(), 3);
    let b = r.pull(other, &ranks, 0, 1, vec![at(0, 0)], false, 5);
    assert_eq!(got(&b), [(0, 0, &b""[..], true)]);
    assert_eq!(r.held(), 0);
    let ack = r.push(other, &ranks, line(3, b"de", false), None, false, 6);
    assert_eq!(ack.next, 5);
    assert_eq!(r.held(), 0);
}

#[test]
fn a_restarted_controller_goes_on_from_where_its_agents_stand() {
    let mut r = InputRelay::default();
    let ranks = [0];
    // The node's agent had written 10 bytes before the restart; it asks first.
    let b = r.pull(KEY, &ranks, 0, 1, vec![at(0, 10)], true, 1);
    assert!(b.chunks.is_empty());
    // The caller's agent goes on from byte 12 (2 bytes were lost with the old buffer).
    assert_eq!(
        r.push(KEY, &ranks, line(12, b"xy", true), None, true, 2)
            .next,
        14
    );
    let b = r.pull(KEY, &ranks, 0, 1, vec![at(0, 10)], true, 3);
    assert_eq!(got(&b), [(0, 12, &b"xy"[..], true)]);
    // Untouched for long: forgotten.
    r.push(KEY, &ranks, line(14, b"z", false), None, true, 4);
    r.pull(
        StepKey { job: 8, step: 0 },
        &ranks,
        0,
        1,
        vec![],
        true,
        5 + crate::step_output::IDLE_MS,
    );
    assert_eq!(r.held(), 0);
}

#[test]
fn one_pull_carries_a_bounded_answer_however_many_tasks_ask() {
    let mut r = InputRelay::default();
    let ranks: Vec<u32> = (0..16).collect();
    let data = vec![b'z'; STEP_BYTES];
    r.push(KEY, &ranks, line(0, &data, false), None, true, 1);
    let all: Vec<TaskInput> = (0..16).map(|t| at(t, 0)).collect();
    let b = r.pull(KEY, &ranks, 0, 16, all, true, 2);
    let sizes: Vec<usize> = b.chunks.iter().map(|c| c.data.len()).collect();
    assert_eq!(sizes.iter().sum::<usize>(), PULL_TOTAL);
    assert!(sizes.iter().all(|&n| n <= PULL_BYTES), "{sizes:?}");
}

#[test]
fn one_jobs_steps_cannot_take_the_whole_relay_from_other_jobs() {
    let mut r = InputRelay::default();
    let ranks = [0];
    let block = vec![b'x'; STEP_BYTES];
    // Job 7 starts many steps whose tasks never read, each filled to its bound.
    for step in 0..(TOTAL_BYTES / STEP_BYTES) as u32 {
        r.push(
            StepKey { job: 7, step },
            &ranks,
            line(0, &block, false),
            None,
            true,
            1,
        );
    }
    assert_eq!(r.held(), JOB_BYTES, "job 7 holds its share and no more");
    // Another job's step still gets its input in.
    let other = StepKey { job: 8, step: 0 };
    assert_eq!(
        r.push(other, &ranks, line(0, b"hello\n", false), None, true, 2)
            .next,
        6
    );
}

#[test]
fn an_offset_at_the_end_of_the_range_is_dropped_without_a_panic() {
    let mut r = InputRelay::default();
    let ranks = [0];
    let far = line(u64::MAX - 5, b"0123456789", false);
    assert_eq!(far.end(), None);
    assert_eq!(r.push(KEY, &ranks, far, None, true, 1).next, u64::MAX);
    let near = line(MAX_OFFSET - 2, b"01", false);
    assert_eq!(r.push(KEY, &ranks, near, None, true, 2).next, MAX_OFFSET);
    let b = r.pull(KEY, &ranks, 0, 1, vec![at(0, 0)], true, 3);
    assert_eq!(got(&b), [(0, MAX_OFFSET - 2, &b"01"[..], false)]);
    assert_eq!(r.held(), 2);
}

/// A controller that restarted (a new relay) while its buffer held input the task had not
/// pulled gets it all again from the caller's agent, which kept it: nothing is lost, and
/// nothing is given twice.
#[test]
fn input_held_when_the_controller_restarted_is_asked_for_again_from_the_caller() {
    let ranks = [0];
    let mut before = InputRelay::default();
    // The caller sent "abcdef"; the task pulled "ab" and wrote it.
    let ack = before.push(KEY, &ranks, line(0, b"abcdef", false), Some(0), true, 1);
    assert_eq!(
        ack,
        InputAck {
            next: 6,
            held_from: Some(0)
        }
    );
    let got = before.pull(KEY, &ranks, 0, 1, vec![at(0, 0)], true, 2);
    assert_eq!(got.chunks[0].data, b"abcdef");
    before.pull(KEY, &ranks, 0, 1, vec![at(0, 2)], true, 3);
    let ack = before.push(KEY, &ranks, line(6, b"gh", false), Some(0), true, 4);
    // The task has "ab": its pusher may forget it.
    assert_eq!(
        ack,
        InputAck {
            next: 8,
            held_from: Some(2)
        }
    );
    for pull_first in [false, true] {
        let mut after = InputRelay::default();
        if pull_first {
            // The task's agent asks first, from what it wrote: there is nothing yet.
            let got = after.pull(KEY, &ranks, 0, 1, vec![at(0, 2)], true, 5);
            assert!(got.chunks.is_empty(), "{got:?}");
        }
        // The caller's next line comes with what its agent still holds (from 2): the
        // controller asks for that first, then takes it.
        let ack = after.push(KEY, &ranks, line(8, b"ij", false), Some(2), true, 6);
        assert_eq!(
            ack,
            InputAck {
                next: 2,
                held_from: Some(2)
            },
            "pull first: {pull_first}"
        );
        let ack = after.push(KEY, &ranks, line(2, b"cdefghij", false), Some(2), true, 7);
        assert_eq!(ack.next, 10);
        let got = after.pull(KEY, &ranks, 0, 1, vec![at(0, 2)], true, 8);
        assert_eq!(got.chunks.len(), 1, "{got:?}");
        assert_eq!(
            (got.chunks[0].offset, &got.chunks[0].data[..]),
            (2, &b"cdefghij"[..])
        );
    }
}

/// An agent from before retaining (no `retained_from`) is answered as before: a gap is
/// gone past, from the push's own offset.
#[test]
fn a_pusher_that_keeps_nothing_goes_on_past_a_gap() {
    let ranks = [0];
    let mut r = InputRelay::default();
    let ack = r.push(KEY, &ranks, line(8, b"ij", false), None, true, 1);
    assert_eq!(ack.next, 10);
    let got = r.pull(KEY, &ranks, 0, 1, vec![at(0, 2)], true, 2);
    assert_eq!(
        (got.chunks[0].offset, &got.chunks[0].data[..]),
        (8, &b"ij"[..])
    );
}

/// The input's end counts as had only once every task got it and closed: a task that has
/// every byte but not yet the end keeps its caller's agent asking, so a controller restart
/// then cannot lose the end.
#[test]
fn the_end_counts_as_had_only_once_every_task_got_it() {
    let ranks = [0];
    let mut r = InputRelay::default();
    r.push(KEY, &ranks, line(0, b"ab", false), Some(0), true, 1);
    r.pull(KEY, &ranks, 0, 1, vec![at(0, 0)], true, 2);
    r.pull(KEY, &ranks, 0, 1, vec![at(0, 2)], true, 3);
    let ack = r.push(KEY, &ranks, line(2, b"", true), Some(0), true, 4);
    assert_eq!(
        ack,
        InputAck {
            next: 2,
            held_from: Some(2)
        },
        "the bytes, not the end"
    );
    let got = r.pull(KEY, &ranks, 0, 1, vec![at(0, 2)], true, 5);
    assert!(got.chunks[0].eof, "{got:?}");
    let closed = TaskInput {
        task: 0,
        offset: 2,
        closed: true,
    };
    r.pull(KEY, &ranks, 0, 1, vec![closed], true, 6);
    let ack = r.push(KEY, &ranks, line(2, b"", true), Some(2), true, 7);
    assert_eq!(
        ack,
        InputAck {
            next: 2,
            held_from: Some(3)
        },
        "the end too"
    );
    assert_eq!(r.held(), 0);
}

/// A restarted controller's buffer is new and counts every rank that takes input as a
/// reader; a rank that had closed its input before the restart pulls no more, so its node's
/// poll says so (`AgentStep::input_closed`), before or after the buffer is made again. On the
/// old code such a rank held the buffer full for good, and its step's other readers starved.
#[test]
fn ranks_reported_closed_hold_nothing_back_after_a_restart() {
    let ranks = [0, 1];
    let block = vec![b'x'; STEP_BYTES];
    // Reported after the buffer is made: rank 1 reads, rank 0 (closed) never pulls.
    let mut r = InputRelay::default();
    let ack = r.push(KEY, &ranks, line(0, &block, false), Some(0), true, 1);
    assert_eq!(ack.next, STEP_BYTES as u64);
    let b = r.pull(KEY, &ranks, 0, 2, vec![at(1, 0)], true, 2);
    assert_eq!(b.chunks[0].data.len(), PULL_BYTES);
    let b = r.pull(KEY, &ranks, 0, 2, vec![at(1, PULL_BYTES as u64)], true, 3);
    assert_eq!(b.chunks[0].offset, PULL_BYTES as u64);
    assert_eq!(r.held(), STEP_BYTES, "rank 0 holds it all");
    let full = r.push(
        KEY,
        &ranks,
        line(STEP_BYTES as u64, b"more", false),
        None,
        true,
        4,
    );
    assert_eq!(full.next, STEP_BYTES as u64, "full: nothing taken");
    r.closed(KEY, &[0], 5);
    // Down to what rank 1 has not had written into it yet (it was sent one more pull).
    assert_eq!(r.held(), STEP_BYTES - PULL_BYTES);
    let ack = r.push(
        KEY,
        &ranks,
        line(STEP_BYTES as u64, b"more", true),
        None,
        true,
        6,
    );
    assert_eq!(ack.next, STEP_BYTES as u64 + 4);
    // Reported before the buffer is made: it is made without rank 0.
    let mut r = InputRelay::default();
    r.closed(KEY, &[0], 1);
    r.push(KEY, &ranks, line(0, b"abc", true), Some(0), true, 2);
    let b = r.pull(KEY, &ranks, 0, 2, vec![at(1, 0)], true, 3);
    assert_eq!(got(&b), [(1, 0, &b"abc"[..], true)]);
    let b = r.pull(KEY, &ranks, 0, 2, vec![at(1, 3)], true, 4);
    assert_eq!(got(&b), [(1, 3, &b""[..], true)]);
    assert_eq!(r.held(), 0);
    // Every reader closed: the end counts as had, so the caller's agent stops asking.
    r.closed(KEY, &[1], 5);
    let ack = r.push(KEY, &ranks, line(3, b"", true), None, true, 6);
    assert_eq!(ack.held_from, Some(4));
    // Forgotten with the step.
    r.forget(KEY);
    assert!(r.closed.is_empty());
}
