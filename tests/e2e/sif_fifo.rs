//! The node reads a user's SIF file as root (to find its partition) after checking the path:
//! whatever the user swaps in between, that read never waits. A FIFO held the agent's launch
//! thread forever, and with it every later launch and stop on the node.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::harness::*;

fn exchange(a: &Path, b: &Path) {
    nix::fcntl::renameat2(None, a, None, b, nix::fcntl::RenameFlags::RENAME_EXCHANGE)
        .unwrap_or_else(|e| panic!("exchanging {} and {}: {e}", a.display(), b.display()));
}

#[test]
fn a_fifo_swapped_in_for_a_sif_never_holds_up_the_node() {
    if !can_run("a_fifo_swapped_in_for_a_sif_never_holds_up_the_node") {
        return;
    }
    const BATCH: usize = 20;
    const MAX_JOBS: usize = 200;
    let c = Cluster::start();
    let mallory = user("whdock-fifo");
    let home = c.home(&mallory);
    // `x.sif` is, by turns, a regular file (it passes the node's path check) and a FIFO
    // nobody writes to, for as long as the jobs launch: what the user's own process could do
    // in their own directory.
    let (name, fifo) = (home.join("x.sif"), home.join("fifo"));
    std::fs::write(&name, vec![0u8; 4096]).unwrap();
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    for p in [&name, &fifo] {
        nix::unistd::chown(p, Some(mallory.uid.into()), Some(mallory.gid.into())).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    let swapper = {
        let (stop, swaps, name) = (stop.clone(), swaps.clone(), name.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                exchange(&name, &fifo);
                std::thread::yield_now();
                swaps.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let image = name.to_str().unwrap();
    // Batches until a launch has met the FIFO after its path check (the race this is about),
    // each job refused with a reason within seconds.
    let (mut reasons, mut raced, mut jobs) = (std::collections::BTreeSet::new(), 0, 0);
    while raced == 0 && jobs < MAX_JOBS {
        let ids: Vec<u64> = (0..BATCH)
            .map(|_| {
                submitted_id(&c.wharf_as(&mallory, &["submit", "--image", image, "--wrap", "true"]))
            })
            .collect();
        jobs += BATCH;
        for id in &ids {
            let job = c.wait_done(*id, Duration::from_secs(60));
            assert_eq!(job["state"], "FAILED", "job {id}: {job}");
            let reason = job["reason"].as_str().unwrap_or_default().to_string();
            assert!(
                ["not readable by", "not a regular file", "no SIF_MAGIC"]
                    .iter()
                    .any(|r| reason.contains(r)),
                "job {id}: {reason}"
            );
            raced += usize::from(reason.contains("not a regular file"));
            reasons.insert(reason.rsplit(": ").next().unwrap_or_default().to_string());
        }
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    eprintln!(
        "{jobs} jobs, {raced} met the FIFO, {} swaps; reasons: {reasons:?}",
        swaps.load(Ordering::Relaxed)
    );
    assert!(
        raced > 0,
        "no launch met the FIFO in {jobs} jobs: the race was not exercised"
    );

    // The node still launches: another job runs to the end at once.
    let started = Instant::now();
    let id = submitted_id(&c.wharf_as(&mallory, &["submit", "--wrap", "true"]));
    let job = c.wait_done(id, Duration::from_secs(60));
    assert_eq!(job["state"], "COMPLETED", "{job}");
    eprintln!("a plain job ran in {:?}", started.elapsed());
}
