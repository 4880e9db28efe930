//! Datanodes as real processes (`walctl serve` and `walctl datanode` on the shared Kafka broker and etcd of
//! `KAFKA_ENDPOINTS` / `ETCD_ENDPOINTS`; the tests fail when either is unset): load with an ack log through kill -9
//! and restarts of datanodes, a zombie datanode stopped for two leases while a new incarnation took over, and
//! flush plus periodic prune rounds with kill -9 of the metasrv and of datanodes. The one number every test checks:
//! acknowledged entries lost = 0 (each acknowledged sequence is in its region's dump exactly once, in order).

#[path = "../support/mod.rs"]
mod support;

#[path = "../serve/cluster.rs"]
mod serve_cluster;

mod bench;
mod chaos;
mod cluster;
mod drop;
mod failover;
mod kill;
mod migrate;
mod prune;
mod zombie;
