//! `walctl create-table --id ID`: the id is the request's idempotency key.

use crate::support::{Env, assert_one_line_error};

#[test]
fn create_table_with_the_same_id_twice_prints_the_same_table() {
    let env = Env::new();
    let args = [
        "create-table",
        "orders",
        "--regions",
        "3",
        "--id",
        "req-orders-1",
    ];
    let first = env.json(None, &args);
    assert_eq!(first[0]["table"].as_str(), Some("greptime.public.orders"));
    // The retry of a call whose reply was lost: the same table, not "already exists".
    let again = env.json(None, &args);
    assert_eq!(again, first);
    let text = env.ok(None, &args);
    assert!(text.contains("greptime.public.orders"), "{text}");
    // Nothing was created twice.
    assert_eq!(
        env.json(None, &["open-regions", "--datanode", "1"]).len(),
        3
    );
}

#[test]
fn another_table_under_a_used_id_is_refused_naming_the_id() {
    let env = Env::new();
    env.json(
        None,
        &["create-table", "first", "--regions", "1", "--id", "req-7"],
    );
    let err = env.err(
        None,
        &["create-table", "second", "--regions", "1", "--id", "req-7"],
    );
    assert_one_line_error(&err);
    assert!(err.contains("procedure id req-7"), "{err}");
    assert!(err.contains("greptime.public.first"), "{err}");
    // The refused request created nothing.
    assert_eq!(
        env.json(None, &["open-regions", "--datanode", "1"]).len(),
        1
    );
}
