//! Crash matrices of the procedure engine: steps, rollback, side effects, subprocedures, a non-idempotent step the
//! harness must catch, hangs, and the state store conformance suite under the crashing store.

#[path = "../support/mod.rs"]
mod support;

mod control;
mod hang;
mod non_idempotent;
mod rollback;
mod side_effects;
mod steps;
mod store_conformance;
mod subprocedures;
