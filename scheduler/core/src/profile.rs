//! A node's availability over time: what is free now, what running jobs give back at their
//! expected ends, and what reservations set aside. Availability only changes at those events,
//! so every question is answered by looking at a handful of them, never by scanning time.

use crate::state::Time;
use crate::tres::Tres;

/// One node's time profile.
#[derive(Debug, Clone)]
pub(crate) struct Profile {
    /// Free now (exactly the free ids).
    pub free: Tres,
    /// Given back at these times (all later than the pass's `now`), in time order:
    /// [`Profile::take`] keeps them so.
    releases: Vec<(Time, Tres)>,
    /// The first release's time (`Time::MAX`: none), kept beside the list: a search over
    /// thousands of nodes passes over one whose first release comes too late without reading
    /// the list, which is where its time went (a cache miss per node).
    first_release: Time,
    /// Set aside on `[start, end)`.
    pub reserved: Vec<(Time, Time, Tres)>,
}

impl Default for Profile {
    fn default() -> Profile {
        Profile {
            free: Tres::default(),
            releases: Vec::new(),
            first_release: Time::MAX,
            reserved: Vec::new(),
        }
    }
}

impl Profile {
    /// A node with `free` free and nothing running or set aside.
    pub fn empty(free: Tres) -> Profile {
        Profile {
            free,
            ..Profile::default()
        }
    }

    /// What running jobs give back, and when, in time order.
    pub fn releases(&self) -> &[(Time, Tres)] {
        &self.releases
    }

    /// What is available at `t`: free now, plus what was given back by `t`, minus what is set
    /// aside at `t`.
    pub fn avail(&self, t: Time) -> Tres {
        let mut a = self.free;
        for (at, r) in &self.releases {
            if *at <= t {
                a.add(r);
            }
        }
        let mut held = Tres::default();
        for (s, e, r) in &self.reserved {
            if *s <= t && t < *e {
                held.add(r);
            }
        }
        // Reservations never exceed what is available; `sub` saturates rather than wraps.
        a.sub(&held);
        a
    }

    /// `need` is available during all of `[from, to)`. Releases only add, so the minimum is at
    /// `from` or where a reservation begins inside the window.
    pub fn fits(&self, need: &Tres, from: Time, to: Time) -> bool {
        if !self.avail(from).covers(need) {
            return false;
        }
        self.reserved
            .iter()
            .filter(|(s, _, _)| from < *s && *s < to)
            .all(|(s, _, _)| self.avail(*s).covers(need))
    }

    /// The earliest time at or after `now` from which `need` is available for `duration`;
    /// `None` when even an empty node could not hold it (`capacity`), or when that time is
    /// later than `until`.
    pub fn earliest(
        &self,
        need: &Tres,
        capacity: &Tres,
        now: Time,
        duration: Time,
        until: Time,
    ) -> Option<Time> {
        if !capacity.covers(need) {
            return None;
        }
        if self.reserved.is_empty() {
            return self.earliest_unreserved(need, now, until);
        }
        self.walk(need, now, duration, until)
    }

    /// [`Profile::earliest`] on a node with nothing set aside (most nodes): availability only
    /// rises, at releases, so the answer is the first time it covers `need`, found in one walk
    /// over the releases in time order, adding each up.
    fn earliest_unreserved(&self, need: &Tres, now: Time, until: Time) -> Option<Time> {
        if self.first_release > now {
            if self.free.covers(need) {
                return (now <= until).then_some(now);
            }
            if self.first_release > until {
                return None;
            }
        }
        let mut a = self.free;
        let mut rest = self.releases.iter().peekable();
        while let Some((_, r)) = rest.next_if(|(at, _)| *at <= now) {
            a.add(r);
        }
        let mut t = now;
        while t <= until {
            if a.covers(need) {
                return Some(t);
            }
            let (next, r) = rest.next()?;
            a.add(r);
            while let Some((_, r)) = rest.next_if(|(at, _)| at == next) {
                a.add(r);
            }
            t = *next;
        }
        None
    }

    /// [`Profile::earliest`] the general way, for a capacity that covers `need`.
    fn walk(&self, need: &Tres, now: Time, duration: Time, until: Time) -> Option<Time> {
        // Availability only rises where a release or a reservation's end falls: try those
        // times in ascending order (a node has a handful).
        let mut t = now;
        while t <= until {
            if self.fits(need, t, t.saturating_add(duration)) {
                return Some(t);
            }
            let releases = self.releases.iter().map(|(at, _)| *at);
            let ends = self.reserved.iter().map(|(_, e, _)| *e);
            t = releases.chain(ends).filter(|&at| at > t).min()?;
        }
        None
    }

    /// The time after which nothing changes any more.
    pub fn last_event(&self, now: Time) -> Time {
        let r = self.releases.iter().map(|(t, _)| *t);
        let e = self.reserved.iter().map(|(_, e, _)| *e);
        r.chain(e).fold(now, Time::max)
    }

    /// Takes `need` now until `end`.
    pub fn take(&mut self, need: &Tres, end: Time) {
        self.free.sub(need);
        let at = self.releases.partition_point(|(t, _)| *t <= end);
        self.releases.insert(at, (end, *need));
        self.first_release = self.first_release.min(end);
    }

    /// Gives back now what [`Profile::take`] took until `end`.
    pub fn give_back(&mut self, held: &Tres, end: Time) {
        if let Some(at) = self
            .releases
            .iter()
            .position(|(t, r)| *t == end && r == held)
        {
            self.releases.remove(at);
            self.first_release = self.releases.first().map_or(Time::MAX, |(t, _)| *t);
            self.free.add(held);
        }
    }

    /// How much of `need` is missing, per resource, at the worst moment of `[from, to)`;
    /// all zero exactly when [`Profile::fits`] holds.
    pub fn shortfall(&self, need: &Tres, from: Time, to: Time) -> Tres {
        let mut short = Tres::default();
        let starts = self
            .reserved
            .iter()
            .map(|(s, _, _)| *s)
            .filter(|s| from < *s && *s < to);
        for t in std::iter::once(from).chain(starts) {
            let mut missing = *need;
            missing.sub(&self.avail(t));
            short.cpus = short.cpus.max(missing.cpus);
            short.memory = short.memory.max(missing.memory);
            for (a, b) in short.gpus.iter_mut().zip(missing.gpus) {
                *a = (*a).max(b);
            }
        }
        short
    }

    /// Moves the release of `what`, expected at `from`, to `to` (a job that ends early, or,
    /// with `to` = `Time::MAX`, one whose end is not counted on).
    pub fn move_release(&mut self, what: &Tres, from: Time, to: Time) {
        if let Some(at) = (self.releases.iter()).position(|(t, r)| *t == from && r == what) {
            let (_, r) = self.releases.remove(at);
            let to_at = self.releases.partition_point(|(t, _)| *t <= to);
            self.releases.insert(to_at, (to, r));
            self.first_release = self.releases[0].0;
        }
    }

    /// Sets `need` aside on `[start, end)`.
    pub fn reserve(&mut self, need: &Tres, start: Time, end: Time) {
        self.reserved.push((start, end, *need));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpus(n: u32) -> Tres {
        Tres {
            cpus: n,
            ..Tres::default()
        }
    }

    /// 8 CPUs: 2 free now, 2 back at 100, 4 back at 300; 4 set aside on [150, 400).
    fn busy() -> Profile {
        let mut p = Profile {
            free: cpus(8),
            reserved: vec![(150, 400, cpus(4))],
            ..Profile::default()
        };
        p.take(&cpus(4), 300);
        p.take(&cpus(2), 100);
        p
    }

    #[test]
    fn earliest_walks_events_in_time_order() {
        let p = busy();
        let cap = cpus(8);
        assert_eq!(p.earliest(&cpus(2), &cap, 0, 100, Time::MAX), Some(0));
        // Over the reservation from 150 nothing is left until 300.
        assert_eq!(p.earliest(&cpus(2), &cap, 0, 1_000, Time::MAX), Some(300));
        // 4 CPUs: at 100 there are 4 until the reservation takes them at 150.
        assert_eq!(p.earliest(&cpus(4), &cap, 0, 10, Time::MAX), Some(100));
        assert_eq!(p.earliest(&cpus(4), &cap, 0, 100, Time::MAX), Some(300));
        assert_eq!(p.earliest(&cpus(8), &cap, 0, 10, Time::MAX), Some(400));
        assert_eq!(p.earliest(&cpus(9), &cap, 0, 10, Time::MAX), None);
    }

    #[test]
    fn without_reservations_the_short_way_agrees_with_the_walk() {
        // A small deterministic generator: every shape of a handful of releases.
        let mut x: u64 = 7;
        let mut next = |m: u64| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % m
        };
        for _ in 0..5_000 {
            // Taken in any order: `take` keeps the releases in time order.
            let taken: Vec<(Time, u32)> = (0..next(6))
                .map(|_| (next(8) * 50, next(4) as u32))
                .collect();
            let held: u32 = taken.iter().map(|(_, n)| n).sum();
            let mut p = Profile {
                free: cpus(next(4) as u32 + held),
                ..Profile::default()
            };
            for (end, n) in taken {
                p.take(&cpus(n), end);
            }
            // Then moved (to any time, or to never) and given back, in any order.
            for _ in 0..next(3) {
                let Some(&(at, r)) = p.releases.get(next(6) as usize) else {
                    continue;
                };
                match next(3) {
                    0 => p.give_back(&r, at),
                    1 => p.move_release(&r, at, Time::MAX),
                    _ => p.move_release(&r, at, next(8) * 50),
                }
            }
            assert!(p.releases.is_sorted_by_key(|(t, _)| *t), "{p:?}");
            assert_eq!(
                p.first_release,
                p.releases.first().map_or(Time::MAX, |r| r.0)
            );
            let (need, now, until) = (cpus(next(10) as u32), next(3) * 50, next(9) * 50);
            assert_eq!(
                p.earliest_unreserved(&need, now, until),
                p.walk(&need, now, 100, until),
                "{p:?} {need:?} {now} {until}"
            );
        }
    }

    /// Releases stay in time order, and the first one's time beside them, however they are
    /// taken, moved and given back.
    #[test]
    fn releases_stay_in_order_through_moves_and_give_backs() {
        let mut p = busy();
        let sorted = |p: &Profile| {
            assert!(p.releases.is_sorted_by_key(|(t, _)| *t), "{p:?}");
            assert_eq!(
                p.first_release,
                p.releases.first().map_or(Time::MAX, |r| r.0)
            );
        };
        sorted(&p);
        p.move_release(&cpus(2), 100, 500);
        sorted(&p);
        assert_eq!(p.earliest(&cpus(4), &cpus(8), 0, 10, Time::MAX), Some(400));
        p.move_release(&cpus(4), 300, 50);
        sorted(&p);
        assert_eq!(p.first_release, 50);
        p.give_back(&cpus(4), 50);
        sorted(&p);
        assert_eq!(p.first_release, 500);
        p.give_back(&cpus(2), 500);
        assert_eq!(p.first_release, Time::MAX);
    }

    #[test]
    fn earliest_gives_up_past_its_bound() {
        let p = busy();
        let cap = cpus(8);
        assert_eq!(p.earliest(&cpus(4), &cap, 0, 100, 300), Some(300));
        assert_eq!(p.earliest(&cpus(4), &cap, 0, 100, 299), None);
        assert_eq!(p.earliest(&cpus(2), &cap, 0, 100, 0), Some(0));
    }
}
