//! The body of the `engine_cpu` and `engine_cpu_system` examples: the same run under two allocators.

use std::error::Error as StdError;
use std::sync::Arc;
use std::time::Instant;

use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::watch;

use procedures::record::{now_ms, record_key};
use procedures::testing::Steps;
use procedures::{
    Condition, EventKind, LocalManager, ManagerConfig, MemoryStateStore, ProcedureEvent,
    ProcedureId, ProcedureManager, ProcedureRecord, ProcedureState, ProcedureWithId, StateStore,
    WriteOp, WriteOutcome,
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

/// How the procedures in flight are kept.
#[derive(Clone, Copy, PartialEq)]
enum Shape {
    /// 64 submitted, then all 64 awaited before the next 64 (the `procedures` bench's shape): fewer than 64 run
    /// while a wave's last ones finish.
    Waves,
    /// One submitted as soon as one finishes: always 64 in flight.
    Window,
    /// One at a time: each submitted once the one before finished (the writes alone then run one at a time too).
    One,
}

impl Shape {
    /// The argument that picks it, as printed with the figures.
    fn name(self) -> &'static str {
        match self {
            Shape::Waves => "waves",
            Shape::Window => "window",
            Shape::One => "one",
        }
    }

    /// How many are in flight at most.
    fn in_flight(self) -> u64 {
        match self {
            Shape::Waves | Shape::Window => 64,
            Shape::One => 1,
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
        Some("one") => Shape::One,
        Some(other) => {
            return Err(
                format!("the third argument is `waves`, `window` or `one`, not `{other}`").into(),
            );
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    // One half alone (warm-up included), for a count of instructions (`scripts/engine_instructions.sh`).
    let only = std::env::var("ENGINE_CPU_ONLY").ok();
    if only.as_deref() == Some("writes") {
        let store = Arc::new(MemoryStateStore::new());
        let mut next = 0u64;
        for total in [20_000, count] {
            rt.block_on(bare_waves(
                &store,
                steps,
                total,
                shape.in_flight(),
                &mut next,
            ))?;
        }
        return Ok(());
    }
    let manager = LocalManager::new(Arc::new(MemoryStateStore::new()), ManagerConfig::default());
    rt.block_on(manager.start())?;
    let mut next = 0u64;
    let mut engine_cpu_per_procedure = f64::NAN;
    for (warm_up, total) in [(true, 20_000), (false, count)] {
        let (started, cpu_before) = (Instant::now(), cpu_seconds()?);
        let mut done = 0;
        if shape == Shape::Window {
            done = rt.block_on(window(&manager, steps, total, &mut next))?;
        }
        let wave = shape.in_flight();
        while done < total {
            rt.block_on(async {
                let mut watchers = Vec::with_capacity(wave as usize);
                for _ in 0..wave {
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
            done += wave;
        }
        let (wall, cpu) = (started.elapsed().as_secs_f64(), cpu_seconds()? - cpu_before);
        if !warm_up {
            engine_cpu_per_procedure = cpu * 1e6 / done as f64;
            println!(
                "{steps} persisted step(s), {done} procedures, {} in flight ({}): {:.1} k/s, {:.1} µs of CPU per procedure",
                wave,
                shape.name(),
                done as f64 / wall / 1000.0,
                engine_cpu_per_procedure
            );
        }
    }
    rt.block_on(manager.stop())?;
    if only.as_deref() == Some("engine") {
        return Ok(());
    }
    let store = Arc::new(MemoryStateStore::new());
    for (warm_up, total) in [(true, 20_000), (false, count)] {
        let (started, cpu_before) = (Instant::now(), cpu_seconds()?);
        let wave = shape.in_flight();
        let done = rt.block_on(bare_waves(&store, steps, total, wave, &mut next))?;
        let (wall, cpu) = (started.elapsed().as_secs_f64(), cpu_seconds()? - cpu_before);
        if !warm_up {
            let floor = cpu * 1e6 / done as f64;
            println!(
                "the same writes without the engine (waves of {wave}): {:.1} k/s, {floor:.1} µs of CPU per procedure; the engine takes {:.2}× that CPU",
                done as f64 / wall / 1000.0,
                engine_cpu_per_procedure / floor
            );
        }
    }
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

/// The floor the engine's figure is read against, run in the same process on the same runtime: `total` (rounded up
/// to a multiple of `wave`) "procedures" in waves of `wave` (64, or 1 for the shape `one`), each only what a persisted procedure of `steps` steps cannot
/// do without. The submitter writes its first record (conditional on its key being absent) and spawns a task that
/// writes one record per step and a last one, done, each a [`ProcedureRecord`] with the history so far (every
/// event encoded once, as the engine does), to a [`MemoryStateStore`] of its own; a watch channel tells the
/// submitter the end. No manager: no epoch, admission, locks, introspection or retries. Returns how many ran; a
/// write that fails or is refused ends the run with its error (a run that skipped writes would flatter the floor).
async fn bare_waves(
    store: &Arc<MemoryStateStore>,
    steps: u32,
    total: u64,
    wave: u64,
    next: &mut u64,
) -> std::result::Result<u64, Box<dyn StdError>> {
    let mut done = 0;
    while done < total {
        let mut ends = Vec::with_capacity(wave as usize);
        for _ in 0..wave {
            *next += 1;
            let mut bare = Bare::new(ProcedureId::new(format!("p{next}")), steps)?;
            let first = store
                .write(
                    vec![Condition::Absent {
                        key: record_key(&bare.record.id),
                    }],
                    vec![bare.put()?],
                )
                .await?;
            applied(first, &bare.record)?;
            let (tx, rx) = watch::channel(None);
            let store = Arc::clone(store);
            tokio::spawn(async move {
                let result = bare.run(&store, steps).await.map_err(|e| e.to_string());
                let _ = tx.send(Some(result));
            });
            ends.push(rx);
        }
        for mut end in ends {
            let ended = end
                .wait_for(Option::is_some)
                .await
                .map_err(|_| "a bare procedure's task ended without a word")?;
            if let Some(Err(e)) = &*ended {
                return Err(e.clone().into());
            }
        }
        done += wave;
    }
    Ok(done)
}

/// `Ok` when the write of `record` was applied; a refusal as an error naming its key.
fn applied(outcome: WriteOutcome, record: &ProcedureRecord) -> std::result::Result<(), String> {
    match outcome {
        WriteOutcome::Applied => Ok(()),
        WriteOutcome::Rejected { .. } => Err(format!(
            "the store refused the write of '{}' (step {})",
            record_key(&record.id),
            record.step
        )),
    }
}

/// A procedure of the floor: its record (without events) and the JSON of each event of its history.
struct Bare {
    record: ProcedureRecord,
    history: Vec<String>,
}

impl Bare {
    /// The first record, as a manager writes it for `Steps`.
    fn new(id: ProcedureId, steps: u32) -> std::result::Result<Self, procedures::Error> {
        let now = now_ms();
        let mut bare = Bare {
            record: ProcedureRecord {
                format_version: 1,
                type_name: "testing_steps".to_string(),
                id,
                parent_id: None,
                step: 0,
                state: ProcedureState::Running,
                data: serde_json::json!({ "steps": steps, "at": 0, "persist": true }),
                output: None,
                error: None,
                waiting_for: Vec::new(),
                created_at_ms: now,
                updated_at_ms: now,
                step_name: None,
                lock_keys: Vec::new(),
                events: Vec::new(),
            },
            history: Vec::new(),
        };
        bare.event(EventKind::Submitted)?;
        Ok(bare)
    }

    /// Writes the records of the steps and the last one, done.
    async fn run(
        &mut self,
        store: &MemoryStateStore,
        steps: u32,
    ) -> std::result::Result<(), Box<dyn StdError + Send + Sync>> {
        for step in 1..=u64::from(steps) + 1 {
            self.record.step = step;
            self.record.updated_at_ms = now_ms();
            self.record.data = serde_json::json!({ "steps": steps, "at": step, "persist": true });
            self.event(EventKind::StepStarted {
                step: None,
                attempt: 1,
            })?;
            self.event(EventKind::StepFinished {
                step: None,
                duration_ms: 0,
            })?;
            if step == u64::from(steps) + 1 {
                self.record.state = ProcedureState::Done;
                self.event(EventKind::Done)?;
            }
            let outcome = store.write(Vec::new(), vec![self.put()?]).await?;
            applied(outcome, &self.record)?;
        }
        Ok(())
    }

    /// Adds an event to the history, encoded once.
    fn event(&mut self, kind: EventKind) -> std::result::Result<(), procedures::Error> {
        let event = ProcedureEvent {
            at_ms: now_ms(),
            kind,
        };
        let json = serde_json::to_string(&event).map_err(|e| self.unserialisable(e))?;
        self.history.push(json);
        Ok(())
    }

    /// The put of the record with its history under its key: the record's JSON with the events' spliced in as its
    /// last field.
    fn put(&self) -> std::result::Result<WriteOp, procedures::Error> {
        let mut value = serde_json::to_vec(&self.record).map_err(|e| self.unserialisable(e))?;
        if value.pop() != Some(b'}') {
            return Err(self.unserialisable(serde::ser::Error::custom("not a JSON object")));
        }
        value.extend_from_slice(br#","events":["#);
        for (i, event) in self.history.iter().enumerate() {
            if i > 0 {
                value.push(b',');
            }
            value.extend_from_slice(event.as_bytes());
        }
        value.extend_from_slice(b"]}");
        Ok(WriteOp::Put {
            key: record_key(&self.record.id),
            value,
        })
    }

    fn unserialisable(&self, source: serde_json::Error) -> procedures::Error {
        procedures::Error::Serialize {
            id: self.record.id.clone(),
            what: "record",
            source,
        }
    }
}
