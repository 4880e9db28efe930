//! The one support module of the engine's test targets (`procedures/tests/crash`, `procedures/tests/manager`); each
//! target includes it with `#[path = "../support/mod.rs"] mod support;`.
#![allow(dead_code)]

pub mod crash;
pub mod manager;
