//! What the process benches share: their knobs from the environment, whether this is the test command's smoke
//! run, and percentiles.
#![allow(dead_code)]

/// The number in environment variable `name`, or `default`.
pub fn env_count<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Whether this run is `cargo test --benches` (the test command runs every bench once, at its smallest, so a
/// broken bench fails CI) rather than `cargo bench`, which passes `--bench`.
pub fn smoke() -> bool {
    !std::env::args().any(|a| a == "--bench")
}

/// The `p` percentile (0 to 1) of `sorted`, which must not be empty.
pub fn percentile<T: Copy>(sorted: &[T], p: f64) -> T {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}
