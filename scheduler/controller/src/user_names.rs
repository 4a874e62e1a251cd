//! The names of the users who call, by uid, kept for a few seconds.
//!
//! Every request over the Unix socket names its caller by the uid the kernel gives with the
//! connection, and the controller needs the user's name (their jobs, their accounts). Looking
//! it up reads the system's user database each time (with plain files, opening and parsing
//! `/etc/passwd`): a twentieth of the controller's work under a flood of submits. A name is
//! kept for [`KEEP`], so a renamed user is known by the new name within that time.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a name is kept.
pub const KEEP: Duration = Duration::from_secs(5);

/// Most names kept: uids come from the kernel, so a caller cannot make many, but a bound
/// costs nothing.
const MOST: usize = 4096;

/// Users' names by uid, each with when it was looked up.
#[derive(Debug, Default)]
pub struct UserNames(Mutex<HashMap<u32, (String, Instant)>>);

impl UserNames {
    /// The name of `uid` (its number, for a uid with no user entry).
    pub fn of(&self, uid: u32) -> String {
        self.of_with(uid, Instant::now(), lookup)
    }

    fn of_with(&self, uid: u32, now: Instant, look: impl FnOnce(u32) -> Option<String>) -> String {
        let kept = |names: &HashMap<u32, (String, Instant)>| {
            names
                .get(&uid)
                .filter(|(_, at)| now.duration_since(*at) < KEEP)
                .map(|(name, _)| name.clone())
        };
        if let Some(name) = kept(&self.names()) {
            return name;
        }
        // Looked up without the lock: a slow user database (LDAP, say) holds up only the
        // callers whose names are not kept.
        let Some(name) = look(uid) else {
            // Not kept: a user made a moment later, or a database that failed once, is
            // found at the next request.
            return uid.to_string();
        };
        let mut names = self.names();
        if names.len() >= MOST {
            names.retain(|_, (_, at)| now.duration_since(*at) < KEEP);
            if names.len() >= MOST {
                names.clear();
            }
        }
        names.insert(uid, (name.clone(), now));
        name
    }

    fn names(&self) -> std::sync::MutexGuard<'_, HashMap<u32, (String, Instant)>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The name of `uid` in the system's user database, if it has an entry there.
fn lookup(uid: u32) -> Option<String> {
    nix::unistd::User::from_uid(uid.into())
        .ok()
        .flatten()
        .map(|u| u.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_looked_up_again_once_kept_long_enough() {
        let names = UserNames::default();
        let t0 = Instant::now();
        assert_eq!(names.of_with(1000, t0, |_| Some("alice".into())), "alice");
        // Within KEEP the kept name answers, without a lookup.
        let kept = names.of_with(1000, t0 + KEEP / 2, |_| panic!("looked up again"));
        assert_eq!(kept, "alice");
        // After it, a rename is seen.
        let renamed = names.of_with(1000, t0 + KEEP, |_| Some("alicia".into()));
        assert_eq!(renamed, "alicia");
        assert_eq!(
            names.of_with(1001, t0 + KEEP, |_| Some("bob".into())),
            "bob"
        );
    }

    #[test]
    fn a_uid_without_a_name_is_looked_up_at_every_request() {
        let names = UserNames::default();
        let t0 = Instant::now();
        assert_eq!(names.of_with(1002, t0, |_| None), "1002");
        // The user is made (or the database answers again) a moment later.
        assert_eq!(names.of_with(1002, t0, |_| Some("carol".into())), "carol");
    }

    #[test]
    fn the_kept_names_stay_bounded() {
        let names = UserNames::default();
        let t0 = Instant::now();
        for uid in 0..(MOST as u32 + 10) {
            names.of_with(uid, t0, |u| Some(u.to_string()));
        }
        assert!(names.0.lock().unwrap().len() <= MOST);
    }

    #[test]
    fn root_is_named_from_the_user_database() {
        assert_eq!(UserNames::default().of(0), "root");
    }
}
