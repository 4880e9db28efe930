//! etcd-specific behaviour: unreachable endpoints fail fast naming them, and etcd's limits are enforced on the
//! client (a txn over 128 ops is refused, nothing applied; big batches are split).

use std::time::Duration;

use remote_wal::Error;
use remote_wal::kv::conformance::{etcd_from_env, unique_prefix};
use remote_wal::kv::{
    EtcdConfig, EtcdKvBackend, KeyValue, KvBackend, PutRequest, RangeRequest, Txn, TxnOp, range_all,
};

use crate::support::Service;

fn config(endpoint: &str) -> EtcdConfig {
    EtcdConfig {
        connect_timeout: Duration::from_millis(1500),
        request_timeout: Duration::from_millis(1500),
        ..EtcdConfig::new([endpoint])
    }
}

/// Guards against a hang: the call under test must end on its own configured timeout, well before this one.
async fn bounded<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("the call ended on its own timeout")
}

#[tokio::test]
async fn a_closed_port_is_reported_naming_the_endpoint() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = listener.local_addr().unwrap().to_string();
    drop(listener);
    let err = bounded(EtcdKvBackend::connect(config(&endpoint)))
        .await
        .expect_err("nothing listens on the port");
    assert!(
        matches!(
            err,
            Error::EtcdConnect { .. } | Error::EtcdConnectTimeout { .. }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().contains(&endpoint),
        "the error names the endpoint: {err}"
    );
    assert!(
        err.is_retryable(),
        "an unreachable cluster may come back: {err}"
    );
}

#[tokio::test]
async fn a_silent_endpoint_times_out_naming_it() {
    // Accepts TCP connections (the kernel backlog) but never speaks HTTP/2.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = listener.local_addr().unwrap().to_string();
    let err = bounded(EtcdKvBackend::connect(config(&endpoint)))
        .await
        .expect_err("the endpoint never answers");
    assert!(
        matches!(
            err,
            Error::EtcdConnectTimeout { .. } | Error::EtcdConnect { .. }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().contains(&endpoint),
        "the error names the endpoint: {err}"
    );
    drop(listener);
}

#[tokio::test]
async fn no_endpoints_is_a_config_error() {
    let err = EtcdKvBackend::connect(EtcdConfig::new(Vec::<String>::new()))
        .await
        .expect_err("no endpoints");
    assert!(matches!(err, Error::EtcdConfig { .. }), "{err:?}");
}

#[tokio::test]
async fn a_txn_over_128_ops_is_refused_and_applies_nothing() {
    let kv = etcd_from_env().await;
    assert_eq!(kv.max_txn_ops(), 128);
    let ns = unique_prefix("txn-limit");
    let key = |i: usize| [ns.clone(), format!("{i:03}").into_bytes()].concat();
    let txn = Txn {
        compare: vec![],
        success: (0..129)
            .map(|i| TxnOp::Put(key(i), b"v".to_vec()))
            .collect(),
        failure: vec![],
    };
    let err = kv.txn(txn).await.expect_err("129 ops");
    assert!(matches!(err, Error::KvLimit { .. }), "{err:?}");
    assert!(
        err.to_string().contains("128"),
        "the error names the limit: {err}"
    );
    assert!(
        kv.range(RangeRequest::prefix(ns.clone()))
            .await
            .unwrap()
            .kvs
            .is_empty(),
        "nothing applied"
    );

    let txn = Txn {
        compare: vec![],
        success: (0..128)
            .map(|i| TxnOp::Put(key(i), b"v".to_vec()))
            .collect(),
        failure: vec![],
    };
    assert!(kv.txn(txn).await.expect("128 ops fit").succeeded);
    assert_eq!(
        range_all(&kv, RangeRequest::prefix(ns), 50)
            .await
            .unwrap()
            .len(),
        128
    );
}

#[tokio::test]
async fn a_batch_of_1000_puts_is_split_and_fully_applied() {
    let kv = etcd_from_env().await;
    let ns = unique_prefix("split");
    let kvs: Vec<KeyValue> = (0..1000)
        .map(|i| KeyValue {
            key: [ns.clone(), format!("{i:04}").into_bytes()].concat(),
            value: vec![b'x'; 100],
        })
        .collect();
    kv.batch_put(kvs.clone(), false).await.unwrap();
    assert_eq!(
        range_all(&kv, RangeRequest::prefix(ns.clone()), 300)
            .await
            .unwrap(),
        kvs
    );
    let keys: Vec<Vec<u8>> = kvs.iter().map(|kv| kv.key.clone()).collect();
    assert_eq!(kv.batch_get(&keys).await.unwrap(), kvs);
    assert_eq!(kv.batch_delete(&keys, true).await.unwrap(), kvs);
    assert!(
        kv.range(RangeRequest::prefix(ns))
            .await
            .unwrap()
            .kvs
            .is_empty()
    );
}

#[tokio::test]
async fn an_endpoint_refusing_connections_is_passed_over_at_connect() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = listener.local_addr().unwrap().to_string();
    drop(listener);
    let live = etcd_from_env().await;
    let kv = bounded(EtcdKvBackend::connect(EtcdConfig {
        connect_timeout: Duration::from_secs(10),
        ..EtcdConfig::new([closed, live.config().endpoints[0].clone()])
    }))
    .await
    .expect("the second member answers");
    let mut key = unique_prefix("kv_etcd");
    key.extend_from_slice(b"refused-first");
    for i in 0..5u8 {
        kv.put(PutRequest {
            key: key.clone(),
            value: vec![i],
            prev_kv: false,
        })
        .await
        .expect("every call reaches the member that answers");
    }
    assert_eq!(kv.get(&key).await.unwrap().unwrap().value, vec![4]);
    kv.delete_range(&key, &[], false).await.unwrap();
}

/// A member of a 3-member cluster going down (its port then refuses connections) must not fail a single call: the
/// client moves to the next member. A balanced channel over all members kept routing requests to the dead one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_going_down_fails_no_call() {
    let cluster = Service::etcd_cluster("kv-member-down", 3);
    let kv = bounded(EtcdKvBackend::connect(EtcdConfig {
        connect_timeout: Duration::from_secs(10),
        request_timeout: Duration::from_secs(10),
        ..EtcdConfig::new(cluster.endpoints.clone())
    }))
    .await
    .expect("connect to the cluster");
    kv.put(PutRequest {
        key: b"k".to_vec(),
        value: b"before".to_vec(),
        prev_kv: false,
    })
    .await
    .unwrap();

    // The client prefers the first member that answered at connect, the first endpoint: stop that one.
    cluster.stop(0);
    for i in 0..30u32 {
        let value = i.to_string().into_bytes();
        bounded(kv.put(PutRequest {
            key: b"k".to_vec(),
            value: value.clone(),
            prev_kv: false,
        }))
        .await
        .unwrap_or_else(|e| panic!("put {i} with a member down: {e}"));
        let read = bounded(kv.get(b"k"))
            .await
            .unwrap_or_else(|e| panic!("get {i} with a member down: {e}"));
        assert_eq!(read.map(|kv| kv.value), Some(value));
    }
}
