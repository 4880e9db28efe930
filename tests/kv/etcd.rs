//! etcd-specific behaviour: unreachable endpoints fail fast naming them, and etcd's limits are enforced on the
//! client (a txn over 128 ops is refused, nothing applied; big batches are split).

use std::sync::Arc;
use std::time::Duration;

use remote_wal::kv::Error;
use remote_wal::kv::conformance::{etcd_from_env, unique_prefix};
use remote_wal::kv::{
    EtcdConfig, EtcdKvBackend, KeyValue, KvBackend, PutRequest, RangeRequest, Txn, TxnOp, range_all,
};

use crate::support::Service;
use crate::support::fault_proxy::{Fault, FaultProxy};

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

/// A member that accepts requests and never answers (blackholed through the fault proxy; three proxies in front
/// of one etcd stand for three members). A write caught on it fails retryably within `member_timeout`, naming it, and the
/// next write starts at the other member; a read caught on a blackholed member moves to the other at once and is
/// answered. Before, every call kept going to the first member and waited out its `request_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_member_is_passed_over_by_the_next_write_and_by_a_read_at_once() {
    let live = etcd_from_env().await;
    let target = live.config().endpoints[0].clone();
    let first = FaultProxy::start(&target);
    let second = FaultProxy::start(&target);
    let third = FaultProxy::start(&target);
    let kv = bounded(EtcdKvBackend::connect(EtcdConfig {
        connect_timeout: Duration::from_secs(10),
        request_timeout: Duration::from_secs(30),
        member_timeout: Duration::from_millis(500),
        ..EtcdConfig::new([first.address(), second.address(), third.address()])
    }))
    .await
    .expect("connect through the proxies");
    let mut key = unique_prefix("kv_etcd");
    key.extend_from_slice(b"blackholed");
    let put = |value: &'static [u8]| {
        kv.put(PutRequest {
            key: key.clone(),
            value: value.to_vec(),
            prev_kv: false,
        })
    };
    bounded(put(b"before"))
        .await
        .expect("through the first member");

    first.set(Fault::Blackhole);
    let err = bounded(put(b"lost?"))
        .await
        .expect_err("the first member answers nothing");
    assert!(err.is_retryable(), "{err}");
    assert!(
        err.to_string().contains(first.address()),
        "the error names the member that did not answer: {err}"
    );
    for value in [b"after-1".as_slice(), b"after-2"] {
        bounded(kv.put(PutRequest {
            key: key.clone(),
            value: value.to_vec(),
            prev_kv: false,
        }))
        .await
        .unwrap_or_else(|e| panic!("the next write goes to the other member: {e}"));
    }

    // Now the second member is preferred: blackhole it too. A read moves on to the third within the call.
    second.set(Fault::Blackhole);
    let read = bounded(kv.get(&key))
        .await
        .expect("a read moves to the other member within the call");
    assert_eq!(read.map(|kv| kv.value), Some(b"after-2".to_vec()));
    let listed = bounded(kv.range(RangeRequest::prefix(key.clone())))
        .await
        .expect("and the next calls start there");
    assert_eq!(listed.kvs.len(), 1);
    kv.delete_range(&key, &[], false).await.unwrap();
}

/// The sum of etcd's `grpc_server_handled_total` for `methods` (read from its `/metrics` over plain HTTP; a
/// blocking read of a local page, short enough for a test's runtime thread).
fn handled(endpoint: &str, methods: &[&str]) -> u64 {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(endpoint).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let request = format!("GET /metrics HTTP/1.0\r\nHost: {endpoint}\r\n\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).unwrap();
    let mut total = 0;
    for line in body.lines() {
        for method in methods {
            let prefix =
                format!("grpc_server_handled_total{{grpc_code=\"OK\",grpc_method=\"{method}\",");
            if line.starts_with(&prefix) {
                let count = line.rsplit(' ').next().unwrap();
                total += count.parse::<f64>().unwrap() as u64;
            }
        }
    }
    total
}

#[tokio::test]
async fn point_reads_made_together_share_one_request_each_answered_its_own() {
    // An etcd of this test's own: no other client's requests are counted.
    let etcd = Service::etcd("point-reads");
    let endpoint = etcd.endpoints[0].clone();
    let kv = EtcdKvBackend::connect(config(&endpoint)).await.unwrap();
    let key = |i: usize| format!("point/{i:02}").into_bytes();
    // Even keys hold a value, odd ones are absent.
    let present: Vec<KeyValue> = (0..64)
        .step_by(2)
        .map(|i| KeyValue {
            key: key(i),
            value: format!("v{i}").into_bytes(),
        })
        .collect();
    kv.batch_put(present, false).await.unwrap();

    let before = handled(&endpoint, &["Range", "Txn"]);
    // 64 gets and a batch_get, polled together: the first goes out alone, the rest queue behind it.
    let keys: Vec<Vec<u8>> = (0..64).map(key).collect();
    let gets = futures::future::join_all(keys.iter().map(|k| kv.get(k)));
    let batch_keys = [key(1), key(2), key(4)];
    let batch = kv.batch_get(&batch_keys);
    let (gets, batch) = futures::join!(gets, batch);
    let after = handled(&endpoint, &["Range", "Txn"]);

    for (i, got) in gets.into_iter().enumerate() {
        let got = got.unwrap().map(|kv| kv.value);
        let expected = (i % 2 == 0).then(|| format!("v{i}").into_bytes());
        assert_eq!(got, expected, "key point/{i:02}");
    }
    let batch: Vec<Vec<u8>> = batch.unwrap().into_iter().map(|kv| kv.value).collect();
    assert_eq!(batch, [b"v2".to_vec(), b"v4".to_vec()]);
    // 65 calls, 67 keys: the first get's request and one for all the others (within 128 ops).
    assert_eq!(
        after - before,
        2,
        "etcd handled {} read requests",
        after - before
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_point_read_queued_behind_another_sees_every_write_answered_before_it() {
    let etcd = Service::etcd("point-reads-fresh");
    let kv = std::sync::Arc::new(
        EtcdKvBackend::connect(config(&etcd.endpoints[0]))
            .await
            .unwrap(),
    );
    // Readers of other keys keep a point read in flight nearly all the time, so the reads below queue.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let noise: Vec<_> = (0..8)
        .map(|i| {
            let (kv, stop) = (kv.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    kv.get(format!("noise/{i}").as_bytes()).await.unwrap();
                }
            })
        })
        .collect();
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let kv = kv.clone();
            tokio::spawn(async move {
                let key = format!("fresh/{w}").into_bytes();
                for n in 0..40 {
                    let value = format!("{n}").into_bytes();
                    kv.put(PutRequest {
                        key: key.clone(),
                        value: value.clone(),
                        prev_kv: false,
                    })
                    .await
                    .unwrap();
                    let read = kv.get(&key).await.unwrap().map(|kv| kv.value);
                    assert_eq!(read, Some(value), "writer {w}, write {n}");
                }
            })
        })
        .collect();
    for writer in writers {
        bounded(writer).await.unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for reader in noise {
        reader.await.unwrap();
    }
}

/// A step that waits until it is interrupted, telling when it started.
struct Waits(Arc<tokio::sync::Notify>);

#[async_trait::async_trait]
impl procedures::Procedure for Waits {
    fn type_name(&self) -> &str {
        "waits"
    }
    async fn execute(
        &mut self,
        _ctx: &procedures::Context,
    ) -> procedures::Result<procedures::Status> {
        self.0.notify_one();
        std::future::pending().await
    }
    fn dump(&self) -> procedures::Result<serde_json::Value> {
        Ok(serde_json::Value::Null)
    }
    fn lock_key(&self) -> procedures::LockKey {
        procedures::LockKey::none()
    }
}

/// A cancel written into etcd by another process reaches a manager whose poll of the control keys is an hour
/// apart: the store watches the control keys, so the manager reads them when they change. (Without the watch the
/// cancel would wait for the poll.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_from_another_process_reaches_a_manager_on_etcd_through_a_watch_not_the_poll() {
    use procedures::{
        ControlOp, LocalManager, ManagerConfig, ProcedureId, ProcedureManager, ProcedureWithId,
    };
    use remote_wal::kv::NamespacedKvBackend;
    use remote_wal::kv::{KvBackendRef, KvStateStore};

    let prefix = unique_prefix("kv_watch");
    let store_on = |etcd: EtcdKvBackend| {
        let kv: KvBackendRef = Arc::new(NamespacedKvBackend::new(Arc::new(etcd), prefix.clone()));
        Arc::new(KvStateStore::new(kv))
    };
    let store = store_on(etcd_from_env().await);
    let started = Arc::new(tokio::sync::Notify::new());
    let manager = LocalManager::new(
        store.clone(),
        ManagerConfig {
            control_poll_interval: Duration::from_secs(3600),
            ..ManagerConfig::default()
        },
    );
    let loaded = started.clone();
    manager
        .register_loader(
            "waits",
            Box::new(move |_| Ok(Box::new(Waits(loaded.clone())))),
        )
        .unwrap();
    manager.start().await.unwrap();
    let id = ProcedureId::new("cancelled-elsewhere");
    let mut watcher = manager
        .submit(ProcedureWithId::new(
            id.clone(),
            Box::new(Waits(started.clone())),
        ))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(30), started.notified())
        .await
        .expect("the step runs");

    // Another process: its own connection and store, no manager.
    let other = store_on(etcd_from_env().await);
    procedures::control::request(other.as_ref(), &id, ControlOp::Cancel)
        .await
        .unwrap();
    let sent = std::time::Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(30), watcher.wait())
        .await
        .expect("the cancel reaches the manager long before its next poll");
    assert!(
        matches!(ended, Err(procedures::Error::ProcedureCancelled { .. })),
        "{ended:?}"
    );
    println!(
        "a cancel from another process ended the step {} ms after it was written",
        sent.elapsed().as_millis()
    );
    manager.stop().await.unwrap();
}
