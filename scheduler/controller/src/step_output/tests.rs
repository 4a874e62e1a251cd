use super::*;
use wharf_api::ExitInfo;

const KEY: StepKey = StepKey { job: 7, step: 0 };

fn chunk(task: u32, stream: Stream, offset: u64, data: &[u8]) -> PushChunk {
    PushChunk {
        task,
        stream,
        offset,
        data: data.to_vec(),
    }
}

fn running() -> StepRecord {
    StepRecord::default()
}

fn ended() -> StepRecord {
    StepRecord {
        exit: Some(ExitInfo::default()),
        ..Default::default()
    }
}

#[test]
fn output_reaches_the_reader_in_order_with_ranks_and_once_only() {
    let mut r = Relay::default();
    // Node 1 of a step with two tasks per node: its tasks are ranks 2 and 3.
    let ack = r.push(
        KEY,
        2,
        0,
        vec![
            chunk(0, Stream::Stdout, 0, b"a\n"),
            chunk(1, Stream::Stderr, 0, b"b"),
        ],
        true,
        10,
    );
    assert_eq!(ack.acks[0].next, 2);
    assert_eq!(ack.acks[1].next, 1);
    // Pushed again (the agent restarted) with more: only the new bytes are taken.
    let ack = r.push(
        KEY,
        2,
        0,
        vec![chunk(0, Stream::Stdout, 0, b"a\nc\n")],
        true,
        11,
    );
    assert_eq!(ack.acks[0].next, 4);
    let batch = r.read(KEY, 0, 0, running(), 12);
    let got: Vec<(u32, Stream, &[u8])> = batch
        .chunks
        .iter()
        .map(|c| (c.rank, c.stream, c.data.as_slice()))
        .collect();
    assert_eq!(
        got,
        [
            (2, Stream::Stdout, &b"a\n"[..]),
            (3, Stream::Stderr, &b"b"[..]),
            (2, Stream::Stdout, &b"c\n"[..])
        ]
    );
    assert!(batch.step.is_none());
    // Acknowledged: gone; a read of an old buffer id acknowledges nothing.
    let last = batch.chunks.last().unwrap().seq;
    let again = r.read(KEY, batch.buffer + 1, last, running(), 13);
    assert_eq!(again.chunks.len(), 3);
    let after = r.read(KEY, batch.buffer, last, running(), 14);
    assert!(after.chunks.is_empty());
    assert_eq!(r.held(), 0);
    // Ended and read out: the step comes with the answer and the buffer is forgotten.
    let done = r.read(KEY, batch.buffer, last, ended(), 15);
    assert!(done.step.is_some());
    assert!(r.steps.is_empty());
}

#[test]
fn a_full_buffer_takes_no_more_until_read_and_then_drops_what_nobody_reads() {
    let mut r = Relay::default();
    let big = vec![b'x'; STEP_BYTES + 100];
    let ack = r.push(KEY, 0, 0, vec![chunk(0, Stream::Stdout, 0, &big)], true, 0);
    assert_eq!(ack.acks[0].next, STEP_BYTES as u64);
    assert_eq!(r.held(), STEP_BYTES);
    // Full: the rest waits with the agent.
    let ack = r.push(
        KEY,
        0,
        0,
        vec![chunk(0, Stream::Stdout, STEP_BYTES as u64, b"yy")],
        true,
        1,
    );
    assert_eq!((ack.acks[0].next, ack.discard), (STEP_BYTES as u64, false));
    // A read answer is bounded.
    let b = r.read(KEY, 0, 0, running(), 2);
    let size: usize = b.chunks.iter().map(|c| c.data.len()).sum();
    assert!(size <= READ_BYTES.max(b.chunks[0].data.len()));
    // Nobody reads for long: what comes is dropped and the reader told how much.
    let late = 2 + READER_GONE_MS + 1;
    let ack = r.push(
        KEY,
        0,
        0,
        vec![chunk(0, Stream::Stdout, STEP_BYTES as u64, b"yy")],
        true,
        late,
    );
    assert!(!ack.discard);
    let ack = r.push(
        KEY,
        0,
        0,
        vec![chunk(0, Stream::Stdout, STEP_BYTES as u64, b"zzz")],
        true,
        late + 1,
    );
    assert!(ack.discard);
    let b = r.read(KEY, 0, 0, running(), late + 2);
    assert_eq!(b.dropped, 3);
    assert!(r.held() <= TOTAL_BYTES);
}

#[test]
fn an_abandoned_or_ended_step_takes_nothing() {
    let mut r = Relay::default();
    r.push(KEY, 0, 0, vec![chunk(0, Stream::Stdout, 0, b"x")], true, 0);
    r.abandon(KEY, 1);
    assert_eq!(r.held(), 0);
    let ack = r.push(KEY, 0, 0, vec![chunk(0, Stream::Stdout, 1, b"y")], true, 2);
    assert!(ack.discard);
    let other = StepKey { job: 8, step: 1 };
    assert!(r.push(other, 0, 0, vec![], false, 3).discard);
    // Forgotten once idle long enough.
    r.push(
        other,
        0,
        0,
        vec![chunk(0, Stream::Stdout, 0, b"z")],
        true,
        4,
    );
    r.read(
        StepKey { job: 9, step: 0 },
        0,
        0,
        running(),
        4 + IDLE_MS + 1,
    );
    assert_eq!(r.held(), 0);
    assert!(!r.steps.contains_key(&other));
}

#[test]
fn a_gone_buffer_asks_for_a_rewind_and_the_agent_may_forget_what_the_reader_took() {
    let mut r = Relay::default();
    let ack = r.push(
        KEY,
        0,
        0,
        vec![chunk(0, Stream::Stdout, 0, b"ab")],
        true,
        10,
    );
    let id = ack.buffer;
    assert_eq!((ack.acks[0].next, ack.acks[0].read), (2, 0));
    let b = r.read(KEY, 0, 0, running(), 11);
    assert_eq!(b.chunks[0].offset, 0);
    r.read(KEY, b.buffer, b.chunks[0].seq, running(), 12);
    let ack = r.push(
        KEY,
        0,
        id,
        vec![chunk(0, Stream::Stdout, 2, b"c")],
        true,
        13,
    );
    assert_eq!((ack.acks[0].next, ack.acks[0].read), (3, 2));
    // The controller restarted: a push naming the old buffer takes nothing.
    let mut r = Relay::default();
    let ack = r.push(
        KEY,
        0,
        id,
        vec![chunk(0, Stream::Stdout, 3, b"d")],
        true,
        20,
    );
    assert!(ack.rewind && ack.acks.is_empty() && ack.buffer != id);
    // Pushed again from where the reader had got to: taken from there, offsets and all.
    let ack = r.push(
        KEY,
        0,
        ack.buffer,
        vec![chunk(0, Stream::Stdout, 2, b"cd")],
        true,
        21,
    );
    assert_eq!(ack.acks[0].next, 4);
    let b = r.read(KEY, 0, 0, running(), 22);
    assert_eq!(
        (b.chunks[0].offset, b.chunks[0].data.as_slice()),
        (2, &b"cd"[..])
    );
}

/// One job's steps, however many and however slowly read, hold at most `JOB_BYTES`
/// together, so another job's step output still gets in. Without the share, 32 steps of one
/// job took the whole relay.
#[test]
fn one_jobs_steps_take_their_share_and_another_jobs_output_still_gets_in() {
    let mut r = Relay::default();
    let full = vec![b'x'; STEP_BYTES];
    let steps = (TOTAL_BYTES / STEP_BYTES) as u32;
    for step in 0..steps {
        let key = StepKey { job: 7, step };
        r.push(key, 0, 0, vec![chunk(0, Stream::Stdout, 0, &full)], true, 1);
    }
    assert_eq!(r.held(), JOB_BYTES, "job 7 holds its share and no more");
    let other = StepKey { job: 8, step: 0 };
    let ack = r.push(
        other,
        0,
        0,
        vec![chunk(0, Stream::Stdout, 0, b"hello")],
        true,
        2,
    );
    assert_eq!(ack.acks[0].next, 5);
}
