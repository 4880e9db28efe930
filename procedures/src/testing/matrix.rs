//! The crash matrix: a golden run, then a crash at every durable write (before and after) and every side-effect
//! point, then a second crash at every point of each recovery, each compared with the golden run.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use crate::config::{ManagerConfig, RetryPolicy};
use crate::error::Error;
use crate::manager::{LocalManager, ProcedureManager};
use crate::procedure::{Output, ProcedureId, ProcedureWithId};
use crate::testing::crash::{CrashController, CrashPlan, CrashPoint, CrashRecord, CrashingStore};
use crate::testing::diff::line_diff;
use crate::testing::scenario::CrashScenario;
use crate::testing::tracked::TrackingManager;

/// How [`run_crash_matrix`] runs.
#[derive(Clone, Debug)]
pub struct MatrixConfig {
    /// The configuration of every manager (the default has millisecond retry delays and a retention longer than
    /// any case, so no record is deleted while a case runs).
    pub manager: ManagerConfig,
    /// The longest any one wait may take: one manager run (start, submissions, results), the end of a crashed
    /// manager's last steps, a `stop`, reading the outcome. A wait that runs out is reported as a mismatch ("hung").
    pub phase_timeout: Duration,
    /// Also crash a second time during each recovery (default: yes).
    pub second_crash: bool,
    /// At most this many second crash points per first crash point, spread evenly over the recovery's points
    /// (first and last included). `None` (the default) runs them all; use a cap only when a scenario's space is too
    /// large to run in full, and say so in the test.
    pub second_crash_sample: Option<usize>,
    /// Cases run at once (each has its own environment and managers).
    pub concurrency: usize,
}

impl Default for MatrixConfig {
    fn default() -> Self {
        let quick = RetryPolicy {
            max_retries: 3,
            initial_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(5),
            factor: 2.0,
        };
        MatrixConfig {
            manager: ManagerConfig {
                step_retry: quick.clone(),
                store_retry: quick,
                retention: Duration::from_secs(24 * 3600),
                retention_check_interval: Duration::from_secs(3600),
                ..ManagerConfig::default()
            },
            phase_timeout: Duration::from_secs(30),
            second_crash: true,
            second_crash_sample: None,
            concurrency: 4,
        }
    }
}

/// How one root procedure ended: its output, or the text of its error.
#[derive(Clone, Debug, PartialEq)]
pub struct RootResult {
    /// The root's id.
    pub id: ProcedureId,
    /// Output, or error text (a failed procedure's watcher error, or why it could not be submitted or watched).
    pub result: Result<Option<Output>, String>,
}

/// One case whose end differs from the golden run (or that hung).
#[derive(Clone, Debug)]
pub struct Mismatch {
    /// The crashes of the case, in order (empty: the golden run itself failed).
    pub crashes: Vec<CrashPoint>,
    /// What differs: a line diff of the golden end (`-`) and this case's end (`+`), or what hung.
    pub detail: String,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.crashes.is_empty() {
            write!(f, "golden run: ")?;
        } else {
            let points: Vec<String> = self.crashes.iter().map(|p| p.to_string()).collect();
            write!(f, "crash {}: ", points.join(", then in recovery "))?;
        }
        write!(f, "{}", self.detail)
    }
}

/// What [`run_crash_matrix`] found.
#[derive(Clone, Debug, Default)]
pub struct MatrixReport {
    /// Durable writes (transitions) of the golden run: N.
    pub transitions: usize,
    /// Side-effect points of the golden run: M.
    pub side_effect_points: usize,
    /// Cases run, single and double crashes together (the golden run not included).
    pub cases_run: usize,
    /// Cases with one crash: 2N + M.
    pub single_crash_cases: usize,
    /// Cases with a second crash during recovery.
    pub double_crash_cases: usize,
    /// Cases where one write's answer was lost (applied, then a retryable error: [`CrashPoint::LostAnswer`]), one
    /// per write of the golden run: N. Counted apart from `cases_run`, which counts crash cases.
    pub lost_answer_cases: usize,
    /// Cases whose planned crash point was never reached (the run made fewer writes or side effects than counted
    /// before: the procedures are not deterministic). Such a case still finishes and is compared.
    pub unreached_crash_points: usize,
    /// Every case whose end differs from the golden run, or that hung.
    pub mismatches: Vec<Mismatch>,
}

impl MatrixReport {
    /// Panics with a readable summary (the first mismatches with their diffs) when any case mismatched.
    pub fn assert_no_mismatch(&self) {
        if !self.mismatches.is_empty() {
            panic!("crash matrix found mismatches: {self}");
        }
    }
}

impl fmt::Display for MatrixReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} transitions, {} side-effect points, {} cases ({} single crash, {} double crash), \
             {} lost-answer cases, {} unreached crash points, {} mismatches",
            self.transitions,
            self.side_effect_points,
            self.cases_run,
            self.single_crash_cases,
            self.double_crash_cases,
            self.lost_answer_cases,
            self.unreached_crash_points,
            self.mismatches.len()
        )?;
        const SHOWN: usize = 5;
        for m in self.mismatches.iter().take(SHOWN) {
            write!(f, "\n\n{m}")?;
        }
        if self.mismatches.len() > SHOWN {
            write!(f, "\n\n... and {} more:", self.mismatches.len() - SHOWN)?;
            for m in &self.mismatches[SHOWN..] {
                let points: Vec<String> = m.crashes.iter().map(|p| p.to_string()).collect();
                write!(f, "\n  {}", points.join(" / "))?;
            }
        }
        Ok(())
    }
}

/// The end of a case: what the submitter saw and what the scenario reads.
#[derive(Debug, PartialEq)]
struct Ending<O> {
    results: Vec<RootResult>,
    outcome: O,
}

/// How one manager run ended.
enum PhaseEnd {
    Finished(Vec<RootResult>),
    Crashed(CrashRecord),
    /// Hung, or could not run at all.
    Broken(String),
}

struct Phase {
    controller: Arc<CrashController>,
    end: PhaseEnd,
}

/// One case: its crashes, and what came of it.
struct CaseReport {
    crashes: Vec<CrashPoint>,
    mismatch: Option<String>,
    unreached: bool,
    /// Writes and side-effect points of the last (uncrashed) recovery: the second-level crash points.
    recovery_points: Vec<CrashPoint>,
}

/// Runs `scenario` under crashes at every durable transition and side-effect point, and compares each case's end
/// with the golden (uncrashed) run.
///
/// 1. Golden run: one manager, no crash; counts the N durable writes and M side-effect points, records each root's
///    result and the scenario's outcome.
/// 2. For every k in 0..N, before and after the write, and every m in 0..M: a fresh environment; a manager that
///    crashes there; a new manager on the same store that recovers, gets the roots submitted again and finishes;
///    its results and the outcome must equal the golden ones.
/// 3. Unless [`MatrixConfig::second_crash`] is off: for every case of 2, the same again with a second crash at
///    every write (before, after) and side-effect point that its recovery made, then a third manager finishes.
/// 4. For every k in 0..N: one manager whose k-th write is applied but answered with a retryable error (a lost
///    answer); it retries and finishes without a crash, and its end must equal the golden one.
///
/// Waits are bounded by [`MatrixConfig::phase_timeout`]; a hang is a mismatch, never a stuck test.
pub async fn run_crash_matrix<S: CrashScenario>(
    scenario: &S,
    config: MatrixConfig,
) -> MatrixReport {
    let mut report = MatrixReport::default();
    let env = scenario.new_env().await;
    let golden_phase = run_phase(scenario, &env, CrashPlan::none(), &config).await;
    let results = match golden_phase.end {
        PhaseEnd::Finished(results) => results,
        PhaseEnd::Crashed(c) => {
            report.mismatches.push(Mismatch {
                crashes: Vec::new(),
                detail: format!("crashed without a crash plan: {} ({})", c.point, c.detail),
            });
            return report;
        }
        PhaseEnd::Broken(what) => {
            report.mismatches.push(Mismatch {
                crashes: Vec::new(),
                detail: what,
            });
            return report;
        }
    };
    let Some(outcome) = read_outcome(scenario, &env, &config).await else {
        report.mismatches.push(Mismatch {
            crashes: Vec::new(),
            detail: "hung: reading the outcome".to_string(),
        });
        return report;
    };
    let golden = Ending {
        results: scenario.canonical_results(results),
        outcome,
    };
    report.transitions = golden_phase.controller.writes();
    report.side_effect_points = golden_phase.controller.side_effect_points();

    let first_level: Vec<Vec<CrashPoint>> =
        crash_points(report.transitions, report.side_effect_points)
            .into_iter()
            .map(|p| vec![p])
            .collect();
    let first = run_cases(scenario, &config, &golden, first_level).await;
    report.single_crash_cases = first.len();

    let mut second_level = Vec::new();
    if config.second_crash {
        for case in &first {
            let points = sample(&case.recovery_points, config.second_crash_sample);
            for p in points {
                let mut crashes = case.crashes.clone();
                crashes.push(p);
                second_level.push(crashes);
            }
        }
    }
    let second = run_cases(scenario, &config, &golden, second_level).await;
    report.double_crash_cases = second.len();
    report.cases_run = first.len() + second.len();

    let lost: Vec<Vec<CrashPoint>> = (0..report.transitions)
        .map(|k| vec![CrashPoint::LostAnswer(k)])
        .collect();
    let lost = run_cases(scenario, &config, &golden, lost).await;
    report.lost_answer_cases = lost.len();

    for case in first.into_iter().chain(second).chain(lost) {
        if case.unreached {
            report.unreached_crash_points += 1;
        }
        if let Some(detail) = case.mismatch {
            report.mismatches.push(Mismatch {
                crashes: case.crashes,
                detail,
            });
        }
    }
    report
}

/// Every crash point of a run with `writes` writes and `side_effects` side-effect points.
fn crash_points(writes: usize, side_effects: usize) -> Vec<CrashPoint> {
    let mut points = Vec::with_capacity(2 * writes + side_effects);
    for k in 0..writes {
        points.push(CrashPoint::BeforeWrite(k));
        points.push(CrashPoint::AfterWrite(k));
    }
    points.extend((0..side_effects).map(CrashPoint::SideEffect));
    points
}

/// At most `limit` of `points`, evenly spread, first and last included.
fn sample(points: &[CrashPoint], limit: Option<usize>) -> Vec<CrashPoint> {
    match limit {
        Some(limit) if points.len() > limit => {
            if limit == 0 {
                return Vec::new();
            }
            if limit == 1 {
                return points[..1].to_vec();
            }
            let mut picked: Vec<CrashPoint> = (0..limit)
                .map(|i| points[i * (points.len() - 1) / (limit - 1)])
                .collect();
            picked.dedup();
            picked
        }
        _ => points.to_vec(),
    }
}

async fn run_cases<S: CrashScenario>(
    scenario: &S,
    config: &MatrixConfig,
    golden: &Ending<S::Outcome>,
    cases: Vec<Vec<CrashPoint>>,
) -> Vec<CaseReport> {
    futures::stream::iter(cases)
        .map(|crashes| run_case(scenario, config, golden, crashes))
        .buffered(config.concurrency.max(1))
        .collect()
        .await
}

async fn run_case<S: CrashScenario>(
    scenario: &S,
    config: &MatrixConfig,
    golden: &Ending<S::Outcome>,
    crashes: Vec<CrashPoint>,
) -> CaseReport {
    let env = scenario.new_env().await;
    let mut report = CaseReport {
        crashes,
        mismatch: None,
        unreached: false,
        recovery_points: Vec::new(),
    };
    let mut finished = None;
    for (i, point) in report.crashes.iter().enumerate() {
        let phase = run_phase(scenario, &env, CrashPlan::at(*point), config).await;
        match phase.end {
            PhaseEnd::Crashed(_) => {}
            PhaseEnd::Finished(results) => {
                // The run ended before reaching its crash point (or, for a lost answer, went on past it as it
                // should); what it produced is the end of this case.
                report.unreached = !matches!(point, CrashPoint::LostAnswer(_))
                    || phase.controller.lost_answer().is_none();
                finished = Some(results);
                break;
            }
            PhaseEnd::Broken(what) => {
                report.mismatch = Some(format!("manager run #{}: {what}", i + 1));
                return report;
            }
        }
    }
    let results = match finished {
        Some(results) => results,
        None => {
            let phase = run_phase(scenario, &env, CrashPlan::none(), config).await;
            report.recovery_points = crash_points(
                phase.controller.writes(),
                phase.controller.side_effect_points(),
            );
            match phase.end {
                PhaseEnd::Finished(results) => results,
                PhaseEnd::Crashed(c) => {
                    report.mismatch = Some(format!(
                        "the final manager crashed without a crash plan: {} ({})",
                        c.point, c.detail
                    ));
                    return report;
                }
                PhaseEnd::Broken(what) => {
                    report.mismatch = Some(format!(
                        "final manager run (#{}): {what}",
                        report.crashes.len() + 1
                    ));
                    return report;
                }
            }
        }
    };
    let Some(outcome) = read_outcome(scenario, &env, config).await else {
        report.mismatch = Some("hung: reading the outcome".to_string());
        return report;
    };
    let got = Ending {
        results: scenario.canonical_results(results),
        outcome,
    };
    if &got != golden {
        report.mismatch = Some(format!(
            "the end differs from the golden run (- golden, + got):\n{}",
            line_diff(&format!("{golden:#?}"), &format!("{got:#?}"))
        ));
    }
    report
}

async fn read_outcome<S: CrashScenario>(
    scenario: &S,
    env: &S::Env,
    config: &MatrixConfig,
) -> Option<S::Outcome> {
    tokio::time::timeout(config.phase_timeout, scenario.outcome(env))
        .await
        .ok()
}

/// One manager's life on the case's store: start, submit (or watch) every root, wait for them; then stop.
async fn run_phase<S: CrashScenario>(
    scenario: &S,
    env: &S::Env,
    plan: CrashPlan,
    config: &MatrixConfig,
) -> Phase {
    let controller = Arc::new(CrashController::new(plan));
    let local = match scenario.crashing_state_store(env, &controller) {
        Some(store) => {
            LocalManager::with_side_effect_hook(store, config.manager.clone(), controller.clone())
        }
        None => {
            let store = Arc::new(CrashingStore::new(
                scenario.state_store(env),
                Arc::clone(&controller),
            ));
            LocalManager::with_side_effect_hook(store.clone(), config.manager.clone(), store)
        }
    };
    let manager = TrackingManager {
        inner: Arc::new(local),
        controller: Arc::clone(&controller),
    };
    let phase = |end| Phase {
        controller: Arc::clone(&controller),
        end,
    };
    if let Err(e) = scenario.register_loaders(env, &manager) {
        return phase(PhaseEnd::Broken(format!(
            "registering the scenario's loaders failed: {e}"
        )));
    }
    let roots = scenario.procedures(env);
    let driven = tokio::time::timeout(config.phase_timeout, drive(&manager, roots)).await;
    let crashed = controller.crashed();
    if crashed.is_some() && !controller.wait_steps_idle(config.phase_timeout).await {
        return phase(PhaseEnd::Broken(format!(
            "hung: {} step(s) of the crashed manager still running after {:?}",
            controller.steps_in_flight(),
            config.phase_timeout
        )));
    }
    // A stop error only repeats why the manager already halted; a stop that hangs is a finding.
    if tokio::time::timeout(config.phase_timeout, manager.stop())
        .await
        .is_err()
    {
        return phase(PhaseEnd::Broken("hung: stop() did not return".to_string()));
    }
    match (driven, crashed) {
        (Ok(_), Some(c)) => phase(PhaseEnd::Crashed(c)),
        (Err(_), Some(c)) => phase(PhaseEnd::Broken(format!(
            "hung: after the crash {} ({}), the manager's watchers did not resolve within {:?}",
            c.point, c.detail, config.phase_timeout
        ))),
        (Err(_), None) => phase(PhaseEnd::Broken(format!(
            "hung: the roots did not finish within {:?}",
            config.phase_timeout
        ))),
        (Ok(results), None) => phase(PhaseEnd::Finished(results)),
    }
}

/// What a submitter does: start the manager, submit every root (watching those the store already knows), wait for
/// each.
async fn drive(manager: &dyn ProcedureManager, roots: Vec<ProcedureWithId>) -> Vec<RootResult> {
    if let Err(e) = manager.start().await {
        return roots
            .into_iter()
            .map(|root| RootResult {
                id: root.id,
                result: Err(format!("start failed: {e}")),
            })
            .collect();
    }
    let mut watchers = Vec::with_capacity(roots.len());
    for root in roots {
        let id = root.id.clone();
        let watcher = match manager.submit(root).await {
            Ok(w) => Ok(w),
            Err(Error::DuplicateProcedure { .. }) => match manager.watch(&id).await {
                Ok(Some(w)) => Ok(w),
                Ok(None) => Err(format!(
                    "submit says {id} exists, but the manager has no watcher for it"
                )),
                Err(e) => Err(format!("watching {id} failed: {e}")),
            },
            Err(e) => Err(format!("submit failed: {e}")),
        };
        watchers.push((id, watcher));
    }
    let mut results = Vec::with_capacity(watchers.len());
    for (id, watcher) in watchers {
        let result = match watcher {
            Ok(mut w) => w.wait().await.map_err(|e| e.to_string()),
            Err(e) => Err(e),
        };
        results.push(RootResult { id, result });
    }
    results
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_write_twice_then_every_side_effect() {
        assert_eq!(
            crash_points(2, 1),
            vec![
                CrashPoint::BeforeWrite(0),
                CrashPoint::AfterWrite(0),
                CrashPoint::BeforeWrite(1),
                CrashPoint::AfterWrite(1),
                CrashPoint::SideEffect(0),
            ]
        );
    }

    #[test]
    fn sampling_keeps_ends_and_spreads_evenly() {
        let points = crash_points(5, 0); // 10 points
        assert_eq!(sample(&points, None), points);
        assert_eq!(sample(&points, Some(20)), points);
        let picked = sample(&points, Some(4));
        assert_eq!(
            picked,
            vec![points[0], points[3], points[6], points[9]],
            "{picked:?}"
        );
        assert_eq!(sample(&points, Some(1)), vec![points[0]]);
        assert!(sample(&points, Some(0)).is_empty());
    }
}
