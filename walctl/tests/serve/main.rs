//! `walctl serve` as real processes: three servers on a three-member etcd cluster (started for each test through
//! `scripts/services.sh start-etcd-cluster`, so a test may kill or stop what it likes), and two servers on one redb
//! file. They check who leads, what followers answer, failover after kill -9 and after a stalled (SIGSTOPped)
//! leader, and that client-chosen ids make table creation exactly-once across a failover.

#[path = "../support/mod.rs"]
mod support;

mod cluster;
mod conflicts;
#[path = "../../../tests/support/fault_proxy.rs"]
mod fault_proxy;

mod answers;
mod client;
mod embedded;
mod failover;
mod handover;
mod kafka;
mod listing;
mod overload;
mod page;
mod partition;
mod postgres;
mod quorum;
mod redb;
mod secure_etcd;
mod security;
mod stalled;
