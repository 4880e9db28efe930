//! CPU time per procedure of the engine on `MemoryStateStore`: `cargo run --release -p procedures --example
//! engine_cpu -- [STEPS] [COUNT]` runs COUNT (default 150,000) procedures of STEPS (default 1) persisted steps, 64
//! in flight from a submitter outside the runtime (the shape of the `procedures` bench), after 20,000 to warm up,
//! and prints procedures per second and the process's CPU time (user + system, from `/proc/self/stat`) per
//! procedure. On a shared machine the CPU time moves less than the throughput between runs, so it is the figure to
//! compare two builds by. Linux only.

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

fn main() -> std::result::Result<(), Box<dyn StdError>> {
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
