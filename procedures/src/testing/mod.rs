//! The crash harness: crash a manager before or after any durable write or at any side-effect point, recover on
//! the same store, and compare the end result with an uncrashed run. (Placeholder: being implemented.)
