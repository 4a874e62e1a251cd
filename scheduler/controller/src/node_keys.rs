//! Who an agent is: each node holds a key of its own.
//!
//! The cluster's join token only lets an agent join: `POST /v1/agent/join` with the token
//! names the node and the key the agent made for it (32 random bytes), which the controller
//! takes for a name that holds no key yet (or holds that very key: a join whose answer was lost
//! is simply made again). The agent keeps the key, made and kept before it asks, and sends it
//! from then on. Every other agent route takes node keys only, and the
//! node a request speaks for is the key's: a node can neither act as another nor, with the
//! join token alone, claim a name that has joined. The controller keeps only each key's
//! SHA-256 (in the store's `node_keys`); a key is 32 random bytes, so its hash is as good as
//! the key for lookup and useless to whoever reads the database.

use std::collections::BTreeMap;
use std::sync::RwLock;

use axum::http::HeaderMap;
use sha2::{Digest, Sha256};
use wharf_api::wire::is_node_key;

/// The SHA-256 of a key.
pub type KeyHash = [u8; 32];

/// What an agent's request showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// The cluster's join token: good for joining only.
    Join,
    /// The key of this node.
    Node(String),
}

/// The join token and the nodes' keys.
#[derive(Debug)]
pub struct NodeKeys {
    join: Vec<u8>,
    keys: RwLock<BTreeMap<KeyHash, String>>,
}

impl NodeKeys {
    /// The join token and the keys of the nodes that joined (name, hash).
    pub fn new(join_token: &str, known: Vec<(String, KeyHash)>) -> NodeKeys {
        NodeKeys {
            join: join_token.as_bytes().to_vec(),
            keys: RwLock::new(known.into_iter().map(|(n, h)| (h, n)).collect()),
        }
    }

    /// What the request's `authorization: Bearer ...` header shows, if anything valid.
    pub fn check(&self, headers: &HeaderMap) -> Option<Credential> {
        let given = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))?;
        // Compared in constant time, so that the token cannot be guessed byte by byte.
        let same = given.len() == self.join.len()
            && given
                .bytes()
                .zip(&self.join)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if same && !self.join.is_empty() {
            return Some(Credential::Join);
        }
        if !is_node_key(given) {
            return None;
        }
        self.read().get(&hash(given)).cloned().map(Credential::Node)
    }

    /// Takes `hash` as `node`'s key, in place of any it had.
    pub fn insert(&self, node: &str, hash: KeyHash) {
        let mut keys = self.write();
        keys.retain(|_, n| n != node);
        keys.insert(hash, node.to_string());
    }

    /// Forgets `node`'s key; whether it had one.
    pub fn remove(&self, node: &str) -> bool {
        let mut keys = self.write();
        let before = keys.len();
        keys.retain(|_, n| n != node);
        keys.len() != before
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<KeyHash, String>> {
        self.keys.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<KeyHash, String>> {
        self.keys.write().unwrap_or_else(|p| p.into_inner())
    }
}

/// The SHA-256 of `key`.
pub fn hash(key: &str) -> KeyHash {
    Sha256::digest(key.as_bytes()).into()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use wharf_api::wire::NODE_KEY_PREFIX;

    fn bearer(t: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("authorization", format!("Bearer {t}").parse().unwrap());
        h
    }

    pub(crate) fn key(n: u8) -> String {
        format!("{NODE_KEY_PREFIX}{}", format!("{n:02x}").repeat(32))
    }

    #[test]
    fn the_join_token_joins_and_a_key_names_its_node() {
        let (k1, k2) = (key(1), key(2));
        assert!(is_node_key(&k1) && is_node_key(&k2));
        for bad in [
            "",
            "wnk_",
            "wnk_00",
            &k1.to_uppercase(),
            &format!("{k1}0"),
            &k1[1..],
        ] {
            assert!(!is_node_key(bad), "{bad:?}");
        }
        let keys = NodeKeys::new("secret", vec![("n1".into(), hash(&k1))]);
        assert_eq!(keys.check(&bearer("secret")), Some(Credential::Join));
        // A join token that looks like a key still joins.
        let odd = NodeKeys::new(&key(9), vec![]);
        assert_eq!(odd.check(&bearer(&key(9))), Some(Credential::Join));
        assert_eq!(
            keys.check(&bearer(&k1)),
            Some(Credential::Node("n1".into()))
        );
        // A key nobody was given, a wrong token, a prefix of the token, none at all.
        for wrong in [k2.as_str(), "secreT", "secre", "", NODE_KEY_PREFIX] {
            assert_eq!(keys.check(&bearer(wrong)), None, "{wrong:?}");
        }
        assert_eq!(keys.check(&HeaderMap::new()), None);
        // A new key for n1 replaces the old one.
        keys.insert("n1", hash(&k2));
        assert_eq!(keys.check(&bearer(&k1)), None);
        assert_eq!(
            keys.check(&bearer(&k2)),
            Some(Credential::Node("n1".into()))
        );
        assert!(keys.remove("n1"));
        assert!(!keys.remove("n1"));
        assert_eq!(keys.check(&bearer(&k2)), None);
        // With no token configured nothing joins.
        assert_eq!(NodeKeys::new("", vec![]).check(&bearer("")), None);
    }
}
