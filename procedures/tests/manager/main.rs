//! The procedure manager: behaviour on the memory store, epochs (fencing of an older manager), and the manager against
//! mocked stores and procedures.

#[path = "../support/mod.rs"]
mod support;

mod behaviour;
mod boundary_scans;
mod control;
mod epoch;
mod finished;
mod interrupt;
mod introspection;
mod lifecycle;
mod listing;
mod locks;
mod mock;
mod paged_recovery;
mod refused;
mod stalled;
mod submission;
