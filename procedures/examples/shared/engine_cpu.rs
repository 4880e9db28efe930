//! The body of the `engine_cpu` and `engine_cpu_system` examples: the same run under two allocators.

use std::error::Error as StdError;
use std::sync::Arc;
use std::time::Instant;

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

/// Runs the example with the arguments of the process; the two `engine_cpu` mains differ only in their allocator.
pub fn run() -> std::result::Result<(), Box<dyn StdError>> {
    let mut args = std::env::args().skip(1);
    let steps: u32 = args.next().map_or(Ok(1), |a| a.parse())?;
    let count: u64 = args.next().map_or(Ok(150_000), |a| a.parse())?;
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
                "{steps} persisted step(s), {done} procedures, 64 in flight: {:.1} k/s, {:.1} µs of CPU per procedure",
                done as f64 / wall / 1000.0,
                cpu * 1e6 / done as f64
            );
        }
    }
    rt.block_on(manager.stop())?;
    Ok(())
}
