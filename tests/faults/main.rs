//! Fault tests: service outages, random crash schedules and a multi-broker cluster. Tests that take a service
//! down start their own named instances through `scripts/services.sh`.
// The library's `Error` is large; whether to box it is decided in the library, not in each test closure.
#![allow(clippy::result_large_err)]

#[path = "../support/mod.rs"]
mod support;

mod cluster;
mod outages;
mod schedules;
