//! Logging setup and what walctl says while it waits: a spinner or bar on a terminal, a plain line on stderr
//! otherwise, at least every [`REPEAT`].

use std::future::Future;
use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use remote_wal::metasrv::BootstrapProgress;

/// The default log filter: our warnings and errors. rskafka's own lines are left out — every failure it meets
/// reaches the user as one error of ours naming the brokers, and it logs an expected "topic already exists" of a
/// resumed bootstrap as an error. `RUST_LOG` overrides the whole filter.
pub const DEFAULT_LOG_FILTER: &str = "warn,rskafka=off";

/// How long a wait lasts before the first "still waiting" line (non-terminal).
const FIRST: Duration = Duration::from_secs(2);
/// How often that line repeats while the wait goes on.
const REPEAT: Duration = Duration::from_secs(5);

/// Logs go to stderr under [`DEFAULT_LOG_FILTER`] unless `RUST_LOG` says otherwise.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// Tells the user what a command waits for while it waits.
pub struct Waiting {
    what: String,
    started: Instant,
    bar: Option<ProgressBar>,
    progress: Mutex<Option<BootstrapProgress>>,
    /// Where a "still waiting" line goes: stderr (a test collects them instead).
    say: Box<dyn Fn(String) + Send + Sync>,
}

impl Waiting {
    /// Waiting for `what` (e.g. `Kafka at host:9092 to create the topic pool 'p' of 64 topics`). On a terminal a
    /// spinner naming it appears on stderr at once.
    pub fn new(what: impl Into<String>) -> Self {
        let what = what.into();
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            if let Ok(style) =
                ProgressStyle::with_template("{spinner} waiting for {msg} ({elapsed})")
            {
                bar.set_style(style);
            }
            bar.set_message(what.clone());
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        Waiting {
            what,
            started: Instant::now(),
            bar,
            progress: Mutex::new(None),
            say: Box::new(|line| eprintln!("{line}")),
        }
    }

    /// Records how far a topic pool bootstrap got; on a terminal the spinner becomes a bar.
    pub fn bootstrap_progress(&self, p: BootstrapProgress) {
        let first = self
            .progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace(p)
            .is_none();
        let Some(bar) = &self.bar else {
            return;
        };
        if first {
            bar.set_length(p.wanted as u64);
            if let Ok(style) = ProgressStyle::with_template(
                "{spinner} creating topics [{bar:40}] {pos}/{len} on the brokers, {msg} ({elapsed})",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
        }
        bar.set_position(p.on_broker as u64);
        bar.set_message(format!("{} persisted", p.persisted));
    }

    /// Runs `work`; when it takes a while and stderr is no terminal, prints a line naming what it waits for
    /// after [`FIRST`] and then every [`REPEAT`].
    pub async fn run<T>(&self, work: impl Future<Output = T>) -> T {
        tokio::pin!(work);
        let mut tick = tokio::time::interval_at(Instant::now() + FIRST, REPEAT);
        loop {
            tokio::select! {
                result = &mut work => return result,
                _ = tick.tick() => {
                    if self.bar.is_none() {
                        (self.say)(self.line());
                    }
                }
            }
        }
    }

    /// `walctl: waiting for WHAT (ELAPSED)[: PROGRESS]`.
    fn line(&self) -> String {
        let elapsed =
            humantime::format_duration(Duration::from_secs(self.started.elapsed().as_secs()));
        let progress = match *self.progress.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(p) => format!(
                ": {} of {} topics on the brokers, {} persisted",
                p.on_broker, p.wanted, p.persisted
            ),
            None => String::new(),
        };
        format!("walctl: waiting for {} ({elapsed}){progress}", self.what)
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// A waiting reporter as on a non-terminal stderr, collecting its lines.
    fn collecting(what: &str) -> (Waiting, Arc<Mutex<Vec<String>>>) {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let waiting = Waiting {
            what: what.to_string(),
            started: Instant::now(),
            bar: None,
            progress: Mutex::new(None),
            say: Box::new(move |line| sink.lock().unwrap().push(line)),
        };
        (waiting, lines)
    }

    // On tokio's paused clock, so the 30 s wait is simulated: the assertion is about when lines are printed.
    #[tokio::test(start_paused = true)]
    async fn a_long_wait_says_what_it_waits_for_after_2_s_and_then_every_5_s() {
        let what = "Kafka at 127.0.0.1:1 to create the topic pool 'p' of 4 topics";
        let (waiting, lines) = collecting(what);
        let out = waiting
            .run(async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                7
            })
            .await;
        assert_eq!(out, 7);
        let lines = lines.lock().unwrap().clone();
        let want: Vec<String> = [2, 7, 12, 17, 22, 27]
            .iter()
            .map(|s| format!("walctl: waiting for {what} ({s}s)"))
            .collect();
        assert_eq!(lines, want);
    }

    #[tokio::test(start_paused = true)]
    async fn a_short_wait_prints_nothing_and_a_line_carries_the_bootstrap_progress() {
        let (waiting, lines) = collecting("x");
        waiting
            .run(tokio::time::sleep(Duration::from_millis(1900)))
            .await;
        assert!(lines.lock().unwrap().is_empty());

        waiting.bootstrap_progress(BootstrapProgress {
            wanted: 64,
            on_broker: 10,
            persisted: 3,
        });
        waiting
            .run(tokio::time::sleep(Duration::from_secs(3)))
            .await;
        let lines = lines.lock().unwrap().clone();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].ends_with(": 10 of 64 topics on the brokers, 3 persisted"),
            "{lines:?}"
        );
    }
}
