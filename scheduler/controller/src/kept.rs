//! Answers of slow lookups in the system's databases, kept for a few seconds.
//!
//! The controller asks the user database for every request's caller (their name) and the
//! group database for every submit to a partition that allows some groups only. With plain
//! files each lookup opens and parses them; with LDAP or sssd it may wait on the network. An
//! answer is kept for [`KEEP`], so a change in the databases (a user renamed, added to a
//! group) is seen within that time, as Slurm sees one at its `GroupUpdateTime`. A lookup that
//! fails is not kept: a user made a moment later, or a database that failed once, is found
//! the next time.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long an answer is kept.
pub const KEEP: Duration = Duration::from_secs(5);

/// Most answers kept: the keys (uids) come from the kernel, so a caller cannot make many,
/// but a bound costs nothing.
const MOST: usize = 4096;

/// Answers by key, each with when it was looked up.
#[derive(Debug)]
pub struct Kept<K, V>(Mutex<HashMap<K, (V, Instant)>>);

impl<K, V> Default for Kept<K, V> {
    fn default() -> Self {
        Kept(Mutex::new(HashMap::new()))
    }
}

impl<K: Eq + Hash + Clone, V: Clone> Kept<K, V> {
    /// The answer for `key` at `now`: the one kept, if younger than [`KEEP`], else `look`'s,
    /// kept when it is one.
    pub fn get_or<E>(
        &self,
        key: &K,
        now: Instant,
        look: impl FnOnce(&K) -> Result<V, E>,
    ) -> Result<V, E> {
        if let Some((v, _)) =
            (self.lock().get(key)).filter(|(_, at)| now.duration_since(*at) < KEEP)
        {
            return Ok(v.clone());
        }
        // Looked up without the lock: a slow database holds up only the callers whose
        // answers are not kept.
        let v = look(key)?;
        let mut kept = self.lock();
        if kept.len() >= MOST {
            kept.retain(|_, (_, at)| now.duration_since(*at) < KEEP);
            if kept.len() >= MOST {
                kept.clear();
            }
        }
        kept.insert(key.clone(), (v.clone(), now));
        Ok(v)
    }

    /// How many answers are kept.
    #[cfg(test)]
    pub fn count(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, (V, Instant)>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(v: &str) -> impl FnOnce(&u32) -> Result<String, ()> + '_ {
        move |_| Ok(v.to_string())
    }

    #[test]
    fn an_answer_is_looked_up_again_once_kept_long_enough() {
        let kept = Kept::default();
        let t0 = Instant::now();
        assert_eq!(kept.get_or(&1000, t0, found("alice")), Ok("alice".into()));
        // Within KEEP the kept answer stands, without a lookup.
        let again = kept.get_or(&1000, t0 + KEEP / 2, |_| -> Result<String, ()> {
            panic!("looked up again")
        });
        assert_eq!(again, Ok("alice".into()));
        // After it, a change is seen.
        assert_eq!(
            kept.get_or(&1000, t0 + KEEP, found("alicia")),
            Ok("alicia".into())
        );
        assert_eq!(
            kept.get_or(&1001, t0 + KEEP, found("bob")),
            Ok("bob".into())
        );
    }

    #[test]
    fn a_failed_lookup_is_not_kept() {
        let kept: Kept<u32, String> = Kept::default();
        let t0 = Instant::now();
        assert_eq!(kept.get_or(&1002, t0, |_| Err("no entry")), Err("no entry"));
        // The user is made (or the database answers again) a moment later.
        assert_eq!(
            kept.get_or(&1002, t0, |_| Ok::<_, ()>("carol".into())),
            Ok("carol".into())
        );
    }

    #[test]
    fn the_kept_answers_stay_bounded() {
        let kept = Kept::default();
        let t0 = Instant::now();
        for uid in 0..(MOST as u32 + 10) {
            kept.get_or(&uid, t0, |u| Ok::<_, ()>(u.to_string()))
                .unwrap();
        }
        assert!(kept.count() <= MOST);
    }
}
