//! The body of the `engine_cpu` and `engine_cpu_system` examples: the same run under two allocators.

use std::error::Error as StdError;
use std::sync::Arc;
use std::time::Instant;

use futures::stream::{FuturesUnordered, StreamExt};

use procedures::testing::Steps;
use procedures::{
    LocalManager, ManagerConfig, MemoryStateStore, ProcedureId, ProcedureManager, ProcedureWithId,
};

/// The process's CPU time so far, in seconds (fields 14 and 15 of `/proc/self/stat`, in clock ticks of 1/100 s).
fn cpu_seconds() -> std::result::Result<f64, Box<dyn StdError>> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let after_name = stat.rsplit(')').next().ok_or("no ')' in /proc/self/stat")?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |i: usize| -> std::result::Result<f64, Box<dyn StdError>> {
        Ok(fields
            .get(i)
            .ok_or("/proc/self/stat is short")?
            .parse::<f64>()?)
    };
    Ok((ticks(11)? + ticks(12)?) / 100.0)
}

/// How the 64 in flight are kept.
#[derive(Clone, Copy, PartialEq)]
enum Shape {
    /// 64 submitted, then all 64 awaited before the next 64 (the `procedures` bench's shape): fewer than 64 run
    /// while a wave's last ones finish.
    Waves,
    /// One submitted as soon as one finishes: always 64 in flight.
    Window,
}

impl Shape {
    /// The argument that picks it, as printed with the figures.
    fn name(self) -> &'static str {
        match self {
            Shape::Waves => "waves",
            Shape::Window => "window",
        }
    }
}

/// Runs the example with the arguments of the process; the two `engine_cpu` mains differ only in their allocator.
pub fn run() -> std::result::Result<(), Box<dyn StdError>> {
    let mut args = std::env::args().skip(1);
    let steps: u32 = args.next().map_or(Ok(1), |a| a.parse())?;
    let count: u64 = args.next().map_or(Ok(150_000), |a| a.parse())?;
    let shape = match args.next().as_deref() {
        None | Some("waves") => Shape::Waves,
        Some("window") => Shape::Window,
        Some(other) => {
            return Err(format!("the third argument is `waves` or `window`, not `{other}`").into());
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let manager = LocalManager::new(Arc::new(MemoryStateStore::new()), ManagerConfig::default());
    rt.block_on(manager.start())?;
    let mut next = 0u64;
    for (warm_up, total) in [(true, 20_000), (false, count)] {
        let (started, cpu_before) = (Instant::now(), cpu_seconds()?);
        let mut done = 0;
        if shape == Shape::Window {
            done = rt.block_on(window(&manager, steps, total, &mut next))?;
        }
        while done < total {
            rt.block_on(async {
                let mut watchers = Vec::with_capacity(64);
                for _ in 0..64 {
                    next += 1;
                    let id = ProcedureId::new(format!("p{next}"));
                    let procedure = Box::new(Steps::new(steps, true));
                    watchers.push(manager.submit(ProcedureWithId::new(id, procedure)).await?);
                }
                for mut watcher in watchers {
                    watcher.wait().await?;
                }
                Ok::<_, procedures::Error>(())
            })?;
            done += 64;
        }
        let (wall, cpu) = (started.elapsed().as_secs_f64(), cpu_seconds()? - cpu_before);
        if !warm_up {
            println!(
                "{steps} persisted step(s), {done} procedures, 64 in flight ({}): {:.1} k/s, {:.1} µs of CPU per procedure",
                shape.name(),
                done as f64 / wall / 1000.0,
                cpu * 1e6 / done as f64
            );
        }
    }
    rt.block_on(manager.stop())?;
    Ok(())
}

/// Runs `total` procedures (rounded up to a multiple of 64, as the waves are) with 64 always in flight: each one
/// that finishes is followed by the next submission. Returns how many ran.
async fn window(
    manager: &LocalManager,
    steps: u32,
    total: u64,
    next: &mut u64,
) -> std::result::Result<u64, procedures::Error> {
    let total = total.div_ceil(64) * 64;
    let mut in_flight = FuturesUnordered::new();
    let (mut submitted, mut done) = (0u64, 0u64);
    while done < total {
        while submitted < total && in_flight.len() < 64 {
            *next += 1;
            submitted += 1;
            let id = ProcedureId::new(format!("p{next}"));
            let procedure = Box::new(Steps::new(steps, true));
            let mut watcher = manager.submit(ProcedureWithId::new(id, procedure)).await?;
            in_flight.push(async move { watcher.wait().await });
        }
        match in_flight.next().await {
            Some(finished) => {
                finished?;
                done += 1;
            }
            None => break,
        }
    }
    Ok(done)
}
