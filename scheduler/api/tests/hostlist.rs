//! Property tests of host lists: expanding what [`compress`] wrote gives back the same set of
//! names, zero padding included; the order of the input does not matter; no text makes the
//! parser panic or build more hosts than its limit.

mod common;

use common::config;
use proptest::prelude::*;
use wharf_api::hostlist::{
    compress, expand, HostList, HostlistError, MAX_HOSTS, MAX_LIST_BYTES, MAX_NAME_BYTES,
};

/// Host names as clusters name them: a short prefix, often a number (padded or not), at times
/// a suffix after it.
fn host() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-c]{1,2}[0-9]{1,3}",
        "[a-c]{1,2}0[0-9]{1,2}",
        "[a-c]{1,2}",
        "[a-c][0-9]{1,2}-ib",
        "[0-9]{1,2}",
    ]
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v.dedup();
    v
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn compressed_lists_expand_to_the_same_names(names in prop::collection::vec(host(), 0..40)) {
        let text = compress(&names);
        if names.is_empty() {
            prop_assert_eq!(text, "");
            return Ok(());
        }
        let back = expand(&text, 1000).unwrap();
        prop_assert_eq!(sorted(back.clone()), sorted(names.clone()), "{}", text);
        // Each name once, and compressing again writes the same text.
        prop_assert_eq!(back.len(), sorted(names.clone()).len(), "{}", text);
        prop_assert_eq!(compress(&back), text.clone());
        let mut reversed = names.clone();
        reversed.reverse();
        prop_assert_eq!(compress(&reversed), text.clone());
        let list = HostList::parse(&text).unwrap();
        prop_assert_eq!(list.names(), &back[..]);
        prop_assert_eq!(list.to_string(), text.clone());
        // Each of its names is found, and a name it lacks is not.
        for n in &names {
            prop_assert!(list.contains(n), "{} in {}", n, text);
        }
        prop_assert!(!list.contains("not-a-host"));
    }

    #[test]
    fn any_text_is_refused_or_bounded(text in prop_oneof![
        "[a-c0-9\\[\\],\\- ]{0,30}",
        any::<String>(),
    ], max in 1usize..200) {
        match expand(&text, max) {
            Ok(names) => {
                prop_assert!(!names.is_empty() && names.len() <= max);
                prop_assert!(names.iter().all(|n| !n.is_empty() && n.len() <= MAX_NAME_BYTES));
                prop_assert!(names.iter().map(String::len).sum::<usize>() <= MAX_LIST_BYTES);
            }
            Err(HostlistError::TooMany { count, .. }) => prop_assert!(count > max as u128),
            Err(e) => prop_assert!(e.to_string().starts_with("host list "), "{e}"),
        }
    }
}

/// A short list must not write out into a huge one: a name longer than a node's may be, or
/// names that take more than `MAX_LIST_BYTES` in all, are refused before anything is built.
/// (Before, a 900 KB name with `[1-65536]` after it asked for 59 GB.)
#[test]
fn long_names_and_lists_too_large_to_write_out_are_refused_before_building() {
    let long = format!("{}[1-65536]", "a".repeat(900_000));
    let e = expand(&long, MAX_HOSTS).unwrap_err().to_string();
    assert!(e.contains("a host name is at most 255"), "{e}");
    let e = expand(&format!("{}1", "b".repeat(255)), 10)
        .unwrap_err()
        .to_string();
    assert!(e.contains("names of up to 256 bytes"), "{e}");
    assert_eq!(expand(&"c".repeat(255), 1).unwrap()[0].len(), 255);
    let wide = format!("{}[00001-65536]", "d".repeat(200));
    match expand(&wide, MAX_HOSTS) {
        Err(HostlistError::TooLarge { bytes, max, .. }) => {
            assert!(bytes > max as u128 && max == MAX_LIST_BYTES)
        }
        other => panic!("{other:?}"),
    }
    // A real cluster's list is far inside.
    assert_eq!(
        expand("gpu-node-[00001-10000]", MAX_HOSTS).unwrap().len(),
        10_000
    );
}

/// The bytes are counted exactly, so a list taken is taken again however it is compressed
/// (stored lists are compressed: on an estimate, this one was accepted and its stored form
/// refused, and a controller that cannot read a stored job does not start). A record kept
/// before the bounds loads as it was written.
#[test]
fn a_list_taken_is_taken_again_compressed_and_stored_lists_load_as_written() {
    // Exact counts, numbers wider than their padding included: the 1 MiB bound is met at
    // exactly its byte and not one before.
    let bytes = |text: &str| -> usize {
        expand(text, MAX_HOSTS)
            .unwrap()
            .iter()
            .map(String::len)
            .sum()
    };
    assert_eq!(bytes("n[001-5000]"), 5000 + 3 * 999 + 4 * 4001);
    assert_eq!(bytes("[0-9]"), 10);
    assert_eq!(bytes("n[9-10]"), 2 + 3);
    let at_bound = format!("{}[00000-65535]", "p".repeat(11));
    assert_eq!(bytes(&at_bound), 65_536 * 16);
    assert_eq!(65_536 * 16, MAX_LIST_BYTES);
    let over = format!("{}[00000-65535]", "p".repeat(12));
    assert!(matches!(
        expand(&over, MAX_HOSTS),
        Err(HostlistError::TooLarge { .. })
    ));
    let text = "x[1-60000],x[100000000000000000-100000000000000999]";
    let list = HostList::parse(text).unwrap();
    let again = HostList::parse(&list.to_string()).unwrap();
    assert_eq!(again, list);
    let long = format!("{}1", "n".repeat(300));
    let stored: HostList = serde_json::from_str(&format!("\"{long}\"")).unwrap();
    assert_eq!(stored.names(), std::slice::from_ref(&long));
    assert!(HostList::parse(&long).is_err(), "a new one is bounded");
}
