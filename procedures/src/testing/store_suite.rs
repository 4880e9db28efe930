//! [`state_store_suite`]: the behaviour every [`StateStore`] must have, as one public test suite each implementation
//! runs against a fresh store per case.

use std::fmt::Debug;
use std::sync::Arc;

use crate::error::Result;
use crate::store::{Condition, StateStore, WriteOp, WriteOutcome};

type Store = Arc<dyn StateStore>;

/// Runs every conformance case, each on a fresh store from `make`. Panics, naming the case and the call, at the
/// first behaviour that differs from the [`StateStore`] contract.
///
/// Covered: `get` of absent and present keys; `put` overwrite, empty and binary values, a 128 KiB value; `scan`
/// in key order, with an empty prefix, with no bleed into neighbouring prefixes (`a/` does not see `a0`, `a.`,
/// `a`), over multi-byte keys; `delete` of several keys at once, of absent keys, of nothing; `write` with
/// `Absent` and `Equals` conditions holding or not, `Rejected` returning every condition key's current value
/// (absent as `None`) in condition order, the atomicity of several ops (all or nothing), `Delete` of an absent key,
/// a compare-and-set of the condition key itself, no conditions at all.
///
/// # Panics
/// On the first non-conforming behaviour (this is a test helper).
pub async fn state_store_suite<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Store>,
{
    get_absent_is_none(make().await).await;
    put_then_get_and_overwrite(make().await).await;
    values_are_bytes(make().await).await;
    scan_is_ordered_and_prefix_bounded(make().await).await;
    scan_with_empty_prefix_sees_everything(make().await).await;
    delete_removes_only_the_given_keys(make().await).await;
    write_absent_condition(make().await).await;
    write_equals_condition(make().await).await;
    write_rejected_reports_current_values_and_applies_nothing(make().await).await;
    write_applies_all_ops_together(make().await).await;
    write_compare_and_set_of_the_condition_key(make().await).await;
    write_without_conditions(make().await).await;
}

fn ok<T>(case: &str, call: &str, r: Result<T>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("StateStore conformance, {case}: {call} failed: {e}"),
    }
}

fn check<T: PartialEq + Debug>(case: &str, what: &str, got: T, want: T) {
    assert_eq!(got, want, "StateStore conformance, {case}: {what}");
}

fn put(key: &str, value: &[u8]) -> WriteOp {
    WriteOp::Put {
        key: key.to_string(),
        value: value.to_vec(),
    }
}

fn del(key: &str) -> WriteOp {
    WriteOp::Delete {
        key: key.to_string(),
    }
}

fn absent(key: &str) -> Condition {
    Condition::Absent {
        key: key.to_string(),
    }
}

fn equals(key: &str, value: &[u8]) -> Condition {
    Condition::Equals {
        key: key.to_string(),
        value: value.to_vec(),
    }
}

async fn get(case: &str, s: &Store, key: &str) -> Option<Vec<u8>> {
    ok(case, &format!("get '{key}'"), s.get(key).await)
}

async fn set(case: &str, s: &Store, key: &str, value: &[u8]) {
    ok(
        case,
        &format!("put '{key}'"),
        s.put(key, value.to_vec()).await,
    )
}

async fn scan_keys(case: &str, s: &Store, prefix: &str) -> Vec<String> {
    ok(case, &format!("scan '{prefix}'"), s.scan(prefix).await)
        .into_iter()
        .map(|(k, _)| k)
        .collect()
}

async fn get_absent_is_none(s: Store) {
    let case = "get_absent_is_none";
    check(
        case,
        "get of a key never written",
        get(case, &s, "nothing/here").await,
        None,
    );
}

async fn put_then_get_and_overwrite(s: Store) {
    let case = "put_then_get_and_overwrite";
    set(case, &s, "k", b"one").await;
    check(
        case,
        "get after put",
        get(case, &s, "k").await,
        Some(b"one".to_vec()),
    );
    set(case, &s, "k", b"two").await;
    check(
        case,
        "get after overwrite",
        get(case, &s, "k").await,
        Some(b"two".to_vec()),
    );
    check(case, "neighbour untouched", get(case, &s, "k2").await, None);
}

async fn values_are_bytes(s: Store) {
    let case = "values_are_bytes";
    set(case, &s, "empty", b"").await;
    check(
        case,
        "empty value is present, not absent",
        get(case, &s, "empty").await,
        Some(Vec::new()),
    );
    let binary: Vec<u8> = (0..=255u8).collect();
    set(case, &s, "binary", &binary).await;
    check(
        case,
        "binary value round-trips",
        get(case, &s, "binary").await,
        Some(binary),
    );
    let large: Vec<u8> = (0..128 * 1024).map(|i| (i % 251) as u8).collect();
    set(case, &s, "large", &large).await;
    check(
        case,
        "128 KiB value round-trips",
        get(case, &s, "large").await,
        Some(large),
    );
    let outcome = ok(
        case,
        "write Absent(empty)",
        s.write(vec![absent("empty")], vec![]).await,
    );
    check(
        case,
        "a key holding an empty value is not absent",
        outcome,
        WriteOutcome::Rejected {
            current: vec![("empty".to_string(), Some(Vec::new()))],
        },
    );
}

async fn scan_is_ordered_and_prefix_bounded(s: Store) {
    let case = "scan_is_ordered_and_prefix_bounded";
    for key in [
        "a/c", "a0", "a/a", "a", "a.", "b/a", "a/b/x", "a/é", "a/z", "a/b",
    ] {
        set(case, &s, key, key.as_bytes()).await;
    }
    check(
        case,
        "scan 'a/' (key order, nothing outside the prefix)",
        scan_keys(case, &s, "a/").await,
        ["a/a", "a/b", "a/b/x", "a/c", "a/z", "a/é"]
            .map(String::from)
            .to_vec(),
    );
    check(
        case,
        "scan 'a/b'",
        scan_keys(case, &s, "a/b").await,
        ["a/b", "a/b/x"].map(String::from).to_vec(),
    );
    check(
        case,
        "scan 'b/'",
        scan_keys(case, &s, "b/").await,
        vec!["b/a".to_string()],
    );
    check(
        case,
        "scan of an unused prefix",
        scan_keys(case, &s, "c/").await,
        Vec::<String>::new(),
    );
    let values = ok(case, "scan 'a/b'", s.scan("a/b").await);
    check(
        case,
        "scan returns each key's value",
        values,
        vec![
            ("a/b".to_string(), b"a/b".to_vec()),
            ("a/b/x".to_string(), b"a/b/x".to_vec()),
        ],
    );
}

async fn scan_with_empty_prefix_sees_everything(s: Store) {
    let case = "scan_with_empty_prefix_sees_everything";
    check(
        case,
        "scan '' of an empty store",
        scan_keys(case, &s, "").await,
        Vec::<String>::new(),
    );
    for key in ["z", "m/1", "a"] {
        set(case, &s, key, b"v").await;
    }
    check(
        case,
        "scan ''",
        scan_keys(case, &s, "").await,
        ["a", "m/1", "z"].map(String::from).to_vec(),
    );
}

async fn delete_removes_only_the_given_keys(s: Store) {
    let case = "delete_removes_only_the_given_keys";
    for key in ["d/1", "d/2", "d/3"] {
        set(case, &s, key, b"v").await;
    }
    ok(
        case,
        "delete [d/1, d/3, d/absent]",
        s.delete(&["d/1".into(), "d/3".into(), "d/absent".into()])
            .await,
    );
    check(
        case,
        "keys left",
        scan_keys(case, &s, "d/").await,
        vec!["d/2".to_string()],
    );
    ok(case, "delete of nothing", s.delete(&[]).await);
    ok(
        case,
        "delete of an absent key",
        s.delete(&["never".into()]).await,
    );
    check(
        case,
        "keys left after no-op deletes",
        scan_keys(case, &s, "d/").await,
        vec!["d/2".to_string()],
    );
}

async fn write_absent_condition(s: Store) {
    let case = "write_absent_condition";
    let first = ok(
        case,
        "write Absent(x) → put x",
        s.write(vec![absent("x")], vec![put("x", b"1")]).await,
    );
    check(
        case,
        "Absent holds on a new key",
        first,
        WriteOutcome::Applied,
    );
    check(
        case,
        "x after the applied write",
        get(case, &s, "x").await,
        Some(b"1".to_vec()),
    );
    let second = ok(
        case,
        "write Absent(x) → put x again",
        s.write(vec![absent("x")], vec![put("x", b"2")]).await,
    );
    check(
        case,
        "Absent fails on an existing key",
        second,
        WriteOutcome::Rejected {
            current: vec![("x".to_string(), Some(b"1".to_vec()))],
        },
    );
    check(
        case,
        "x unchanged after the rejected write",
        get(case, &s, "x").await,
        Some(b"1".to_vec()),
    );
}

async fn write_equals_condition(s: Store) {
    let case = "write_equals_condition";
    set(case, &s, "e", b"old").await;
    let applied = ok(
        case,
        "write Equals(e, old) → put f",
        s.write(vec![equals("e", b"old")], vec![put("f", b"1")])
            .await,
    );
    check(
        case,
        "Equals holds on the same value",
        applied,
        WriteOutcome::Applied,
    );
    check(
        case,
        "f after the applied write",
        get(case, &s, "f").await,
        Some(b"1".to_vec()),
    );
    let wrong = ok(
        case,
        "write Equals(e, other) → put f",
        s.write(vec![equals("e", b"other")], vec![put("f", b"2")])
            .await,
    );
    check(
        case,
        "Equals fails on a different value",
        wrong,
        WriteOutcome::Rejected {
            current: vec![("e".to_string(), Some(b"old".to_vec()))],
        },
    );
    let missing = ok(
        case,
        "write Equals(g, old) → put f",
        s.write(vec![equals("g", b"old")], vec![put("f", b"3")])
            .await,
    );
    check(
        case,
        "Equals fails on an absent key and reports it absent",
        missing,
        WriteOutcome::Rejected {
            current: vec![("g".to_string(), None)],
        },
    );
    let empty = ok(
        case,
        "write Equals(g, '') → put f",
        s.write(vec![equals("g", b"")], vec![put("f", b"4")]).await,
    );
    check(
        case,
        "Equals with an empty value fails on an absent key",
        empty,
        WriteOutcome::Rejected {
            current: vec![("g".to_string(), None)],
        },
    );
    check(
        case,
        "f only changed by the applied write",
        get(case, &s, "f").await,
        Some(b"1".to_vec()),
    );
}

async fn write_rejected_reports_current_values_and_applies_nothing(s: Store) {
    let case = "write_rejected_reports_current_values_and_applies_nothing";
    set(case, &s, "r/held", b"h").await;
    set(case, &s, "r/victim", b"v").await;
    let outcome = ok(
        case,
        "write [Equals(r/held, h), Absent(r/held2), Absent(r/victim)] → [put r/new, delete r/victim, put r/held]",
        s.write(
            vec![
                equals("r/held", b"h"),
                absent("r/missing"),
                absent("r/victim"),
            ],
            vec![
                put("r/new", b"n"),
                del("r/victim"),
                put("r/held", b"changed"),
            ],
        )
        .await,
    );
    check(
        case,
        "one failed condition rejects; current values in condition order",
        outcome,
        WriteOutcome::Rejected {
            current: vec![
                ("r/held".to_string(), Some(b"h".to_vec())),
                ("r/missing".to_string(), None),
                ("r/victim".to_string(), Some(b"v".to_vec())),
            ],
        },
    );
    check(
        case,
        "nothing of the rejected write applied",
        ok(case, "scan r/", s.scan("r/").await),
        vec![
            ("r/held".to_string(), b"h".to_vec()),
            ("r/victim".to_string(), b"v".to_vec()),
        ],
    );
}

async fn write_applies_all_ops_together(s: Store) {
    let case = "write_applies_all_ops_together";
    set(case, &s, "w/gone", b"g").await;
    set(case, &s, "w/kept", b"k").await;
    let outcome = ok(
        case,
        "write [Absent(w/a), Equals(w/kept, k)] → [put w/a, put w/b, delete w/gone, delete w/never]",
        s.write(
            vec![absent("w/a"), equals("w/kept", b"k")],
            vec![
                put("w/a", b"1"),
                put("w/b", b"2"),
                del("w/gone"),
                del("w/never"),
            ],
        )
        .await,
    );
    check(
        case,
        "multi-op write with holding conditions (Delete of an absent key included)",
        outcome,
        WriteOutcome::Applied,
    );
    check(
        case,
        "every op applied",
        ok(case, "scan w/", s.scan("w/").await),
        vec![
            ("w/a".to_string(), b"1".to_vec()),
            ("w/b".to_string(), b"2".to_vec()),
            ("w/kept".to_string(), b"k".to_vec()),
        ],
    );
}

async fn write_compare_and_set_of_the_condition_key(s: Store) {
    let case = "write_compare_and_set_of_the_condition_key";
    let claim = ok(
        case,
        "claim epoch 1",
        s.write(vec![absent("epoch")], vec![put("epoch", b"1")])
            .await,
    );
    check(case, "first claim", claim, WriteOutcome::Applied);
    let bump = ok(
        case,
        "epoch 1 → 2",
        s.write(vec![equals("epoch", b"1")], vec![put("epoch", b"2")])
            .await,
    );
    check(case, "compare-and-set", bump, WriteOutcome::Applied);
    let stale = ok(
        case,
        "stale epoch 1 → 3",
        s.write(vec![equals("epoch", b"1")], vec![put("epoch", b"3")])
            .await,
    );
    check(
        case,
        "a stale compare-and-set is rejected",
        stale,
        WriteOutcome::Rejected {
            current: vec![("epoch".to_string(), Some(b"2".to_vec()))],
        },
    );
    let remove = ok(
        case,
        "delete epoch if 2",
        s.write(vec![equals("epoch", b"2")], vec![del("epoch")])
            .await,
    );
    check(
        case,
        "conditional delete of the condition key",
        remove,
        WriteOutcome::Applied,
    );
    check(
        case,
        "epoch after the conditional delete",
        get(case, &s, "epoch").await,
        None,
    );
}

async fn write_without_conditions(s: Store) {
    let case = "write_without_conditions";
    let outcome = ok(
        case,
        "write [] → [put u/1, put u/2]",
        s.write(vec![], vec![put("u/1", b"1"), put("u/2", b"2")])
            .await,
    );
    check(
        case,
        "no conditions always applies",
        outcome,
        WriteOutcome::Applied,
    );
    check(
        case,
        "keys written",
        scan_keys(case, &s, "u/").await,
        vec!["u/1".to_string(), "u/2".to_string()],
    );
    let nothing = ok(case, "write [] → []", s.write(vec![], vec![]).await);
    check(
        case,
        "an empty write applies",
        nothing,
        WriteOutcome::Applied,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory_store::MemoryStateStore;

    #[tokio::test]
    async fn memory_store_conforms() {
        state_store_suite(|| async { Arc::new(MemoryStateStore::new()) as Store }).await;
    }
}
