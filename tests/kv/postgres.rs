//! The PostgreSQL backend beyond the conformance suite, on the cluster the test command starts (`POSTGRES_URL`,
//! `POSTGRES_PASSWORD_FILE`; the tests fail when they are unset): conditional writes racing from many connections
//! decide exactly as one at a time would (serializable transactions, retried when PostgreSQL aborts one), a
//! refused password and a table of another layout are errors naming the endpoint or the table and never the
//! password.

use std::sync::Arc;

use remote_wal::kv::conformance::{postgres_config_from_env, postgres_from_env, unique_prefix};
use remote_wal::kv::{Compare, CompareAndPutRequest, KvBackendRef, PostgresKvBackend, Txn, TxnOp};

/// 8 writers each add 1 to one counter 25 times by compare-and-put (reading it again when they lose): no
/// increment is lost, so the end value is 200; and 16 writers race to create one key by a transaction conditioned
/// on its absence: exactly one succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_conditional_writes_decide_as_one_at_a_time_would() {
    let kv: KvBackendRef = Arc::new(postgres_from_env("races").await);
    let prefix = unique_prefix("pg-race");
    let counter = [prefix.clone(), b"counter".to_vec()].concat();
    let mut writers = Vec::new();
    for _ in 0..8 {
        let (kv, counter) = (kv.clone(), counter.clone());
        writers.push(tokio::spawn(async move {
            let mut lost = 0u32;
            for _ in 0..25 {
                loop {
                    let current = kv.get(&counter).await.unwrap().map(|kv| kv.value);
                    let n: u64 = current
                        .as_deref()
                        .map_or(0, |v| std::str::from_utf8(v).unwrap().parse().unwrap());
                    let done = kv
                        .compare_and_put(CompareAndPutRequest {
                            key: counter.clone(),
                            expect: current,
                            value: (n + 1).to_string().into_bytes(),
                        })
                        .await
                        .unwrap();
                    if done.success {
                        break;
                    }
                    lost += 1;
                }
            }
            lost
        }));
    }
    let mut lost = 0;
    for w in writers {
        lost += w.await.unwrap();
    }
    let value = kv.get(&counter).await.unwrap().unwrap().value;
    assert_eq!(
        value, b"200",
        "an increment was lost ({lost} compare-and-puts lost a race)"
    );

    let key = [prefix.clone(), b"once".to_vec()].concat();
    let mut racers = Vec::new();
    for i in 0..16u8 {
        let (kv, key) = (kv.clone(), key.clone());
        racers.push(tokio::spawn(async move {
            kv.txn(Txn {
                compare: vec![Compare::Absent(key.clone())],
                success: vec![TxnOp::Put(key, vec![i])],
                failure: vec![],
            })
            .await
            .unwrap()
            .succeeded
        }));
    }
    let mut winners = 0;
    for r in racers {
        winners += usize::from(r.await.unwrap());
    }
    assert_eq!(
        winners, 1,
        "more or fewer than one creation of one key succeeded"
    );
    kv.delete_range(&prefix, &remote_wal::kv::prefix_end(&prefix), false)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_refused_password_names_the_endpoint_and_not_the_password() {
    let mut config = postgres_config_from_env("refused");
    config.connection.password("not-the-password-4711");
    let err = PostgresKvBackend::connect(config).await.unwrap_err();
    let text = err.to_string();
    assert!(text.starts_with("PostgreSQL at 127.0.0.1:"), "{text}");
    assert!(text.contains("password authentication failed"), "{text}");
    assert!(!text.contains("not-the-password-4711"), "{text}");
    assert!(!err.is_retryable(), "{text}");
}

#[tokio::test]
async fn a_table_of_another_layout_version_is_refused_naming_it() {
    let table = format!(
        "layout_{}",
        String::from_utf8(unique_prefix("v"))
            .unwrap()
            .trim_end_matches('/')
            .replace('-', "_")
    );
    let kv = postgres_from_env(&table).await;
    // A later release's layout, as it would record it.
    let config = postgres_config_from_env(&table);
    let (client, connection) = config
        .connection
        .connect(tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .execute(
            &format!(
                "UPDATE \"public\".\"{table}_meta\" SET value = '2' WHERE name = 'schema_version'"
            ),
            &[],
        )
        .await
        .unwrap();
    drop(kv);
    let err = PostgresKvBackend::connect(config)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("\"{table}\"")) && err.contains("its layout is version 2"),
        "{err}"
    );
    client
        .batch_execute(&format!(
            "DROP TABLE \"public\".\"{table}\", \"public\".\"{table}_meta\""
        ))
        .await
        .unwrap();
}

/// A key a transaction only compares cannot change between its compare and its commit: while another session
/// holds an uncommitted change of that key (made as every writer makes one: holding the key's lock), the
/// transaction waits for it (PostgreSQL shows it waiting on that key's lock), then decides on the value committed,
/// refusing its compare. Without the shared lock on the compared key it would compare the old value and commit
/// beside the change, which is what would let a deposed leader's write pass a takeover
/// (`docs/metadata-store.md`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_a_transaction_only_compares_cannot_change_before_it_commits() {
    let table = crate::support::unique("pgshare");
    let config = postgres_config_from_env(&table);
    let backend = PostgresKvBackend::connect(config.clone()).await.unwrap();
    let prefix = unique_prefix("pg-share");
    let (table_lock, fence_lock) = backend.lock_ids(&[prefix.clone(), b"fence".to_vec()].concat());
    let kv: KvBackendRef = Arc::new(backend);
    let fence = [prefix.clone(), b"fence".to_vec()].concat();
    let written = [prefix.clone(), b"written".to_vec()].concat();
    kv.put(remote_wal::kv::PutRequest {
        key: fence.clone(),
        value: b"old".to_vec(),
        prev_kv: false,
    })
    .await
    .unwrap();

    let (mut changer, connection) = config
        .connection
        .connect(tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let change = changer.transaction().await.unwrap();
    change
        .execute(
            "SELECT pg_advisory_xact_lock_shared($1), pg_advisory_xact_lock($2)",
            &[&table_lock, &fence_lock],
        )
        .await
        .unwrap();
    change
        .execute(
            &format!("UPDATE public.\"{table}\" SET v = 'new' WHERE k = $1"),
            &[&fence],
        )
        .await
        .unwrap();

    let txn = {
        let (kv, fence, written) = (kv.clone(), fence.clone(), written.clone());
        tokio::spawn(async move {
            kv.txn(Txn {
                compare: vec![Compare::ValueEquals(fence, b"old".to_vec())],
                success: vec![TxnOp::Put(written, b"v".to_vec())],
                failure: Vec::new(),
            })
            .await
        })
    };
    let (watcher, connection) = config
        .connection
        .connect(tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    // A bigint advisory lock shows in pg_locks as (classid, objid) = its high and low 32 bits, objsubid 1.
    let waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
         AND classid::int8 = $1 AND objid::int8 = $2 AND objsubid = 1";
    let (high, low) = (
        ((fence_lock as u64) >> 32) as i64,
        ((fence_lock as u64) & 0xffff_ffff) as i64,
    );
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let n: i64 = watcher
            .query_one(waiting, &[&high, &low])
            .await
            .unwrap()
            .get(0);
        if n > 0 {
            break;
        }
        assert!(
            !txn.is_finished(),
            "the transaction did not wait for the uncommitted change of the key it compared: {:?}",
            txn.await
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "the transaction never waited"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    change.commit().await.unwrap();
    let resp = txn.await.unwrap().unwrap();
    assert!(
        !resp.succeeded,
        "the compare passed on a value changed before the commit"
    );
    assert!(kv.get(&written).await.unwrap().is_none());
}
