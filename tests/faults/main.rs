//! Fault tests: service outages, random crash schedules and a multi-broker cluster. Tests that take a service
//! down start their own named instances through `scripts/services.sh`.

#[path = "../support/mod.rs"]
mod support;

mod cluster;
mod outages;
mod schedules;
