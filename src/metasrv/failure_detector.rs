//! A phi-accrual failure detector per datanode, fed by the arrival times of its heartbeats (`docs/datanode.md`,
//! "Failure detection").
//!
//! Instead of a fixed timeout, the detector keeps the recent intervals between a datanode's heartbeats and
//! answers, at any moment, how unlikely it is that the next heartbeat is merely late: `phi = -log10(P(a heartbeat
//! arrives later than now))` under a normal distribution of the intervals, with `acceptable_pause` added to their
//! mean (a pause of that length is not suspicious) and their standard deviation at least `min_std` (a perfectly
//! regular sender is not declared dead by one slightly late heartbeat). `phi = 8` means a 1 in 10⁸ chance of a
//! false suspicion under that model. With a 1 s interval, 100 ms standard deviation and a 3 s acceptable pause, phi
//! passes 8 about 4.5 s after the last heartbeat.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::config::FailoverConfig;

/// How many intervals the detector remembers.
pub const WINDOW: usize = 100;

/// The detector of one datanode.
#[derive(Clone, Debug)]
pub struct PhiAccrualDetector {
    acceptable_pause: Duration,
    min_std: Duration,
    intervals: VecDeque<f64>,
    sum: f64,
    sum_sq: f64,
    /// The last heartbeat of any kind: the silence counts from it.
    last: Option<Instant>,
    /// The last regular one: intervals are measured between these.
    last_regular: Option<Instant>,
}

impl PhiAccrualDetector {
    /// A detector for a datanode heartbeating every `interval`: its first phi, before two heartbeats arrived,
    /// assumes intervals of `interval` with a quarter of it as their standard deviation.
    pub fn new(config: &FailoverConfig, interval: Duration) -> Self {
        let mut detector = PhiAccrualDetector {
            acceptable_pause: config.acceptable_pause,
            min_std: config.min_std,
            intervals: VecDeque::with_capacity(WINDOW),
            sum: 0.0,
            sum_sq: 0.0,
            last: None,
            last_regular: None,
        };
        let mean = millis(interval);
        let std = mean / 4.0;
        detector.push(mean - std);
        detector.push(mean + std);
        detector
    }

    fn push(&mut self, interval_ms: f64) {
        if self.intervals.len() == WINDOW
            && let Some(old) = self.intervals.pop_front()
        {
            self.sum -= old;
            self.sum_sq -= old * old;
        }
        self.intervals.push_back(interval_ms);
        self.sum += interval_ms;
        self.sum_sq += interval_ms * interval_ms;
    }

    /// A heartbeat arrived at `at`.
    pub fn heartbeat(&mut self, at: Instant) {
        if let Some(last) = self.last_regular
            && at > last
        {
            self.push(millis(at - last));
        }
        self.last_regular = Some(self.last_regular.map_or(at, |l| l.max(at)));
        self.last = Some(self.last.map_or(at, |l| l.max(at)));
    }

    /// A heartbeat sent before its interval was up arrived at `at`: the silence is counted from it, but it is not
    /// an interval (the next regular heartbeat's interval is measured from the last regular one).
    pub fn early_heartbeat(&mut self, at: Instant) {
        self.last = Some(self.last.map_or(at, |l| l.max(at)));
    }

    /// When the last heartbeat arrived.
    pub fn last_heartbeat(&self) -> Option<Instant> {
        self.last
    }

    /// The suspicion at `now`: 0 before any heartbeat, and right after one; growing with the silence since.
    pub fn phi(&self, now: Instant) -> f64 {
        let Some(last) = self.last else {
            return 0.0;
        };
        let n = self.intervals.len().max(1) as f64;
        let mean = self.sum / n;
        let variance = (self.sum_sq / n - mean * mean).max(0.0);
        let std = variance.sqrt().max(millis(self.min_std));
        phi(
            millis(now.saturating_duration_since(last)),
            mean + millis(self.acceptable_pause),
            std,
        )
    }
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// `-log10` of the probability that a normally distributed (`mean`, `std`) interval exceeds `elapsed`, by the
/// logistic approximation of the normal distribution's tail (accurate to a few percent, never NaN; capped where
/// f64 runs out).
fn phi(elapsed: f64, mean: f64, std: f64) -> f64 {
    let y = (elapsed - mean) / std;
    let e = (-y * (1.5976 + 0.070566 * y * y)).exp();
    let p_later = if elapsed > mean {
        e / (1.0 + e)
    } else {
        1.0 - 1.0 / (1.0 + e)
    };
    if p_later <= f64::MIN_POSITIVE {
        return f64::from(f64::MAX_10_EXP);
    }
    (-p_later.log10()).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> FailoverConfig {
        FailoverConfig::default()
    }

    /// A detector that saw heartbeats every `interval` for `beats` heartbeats, starting at `start`; returns it and
    /// the last heartbeat's time.
    fn regular(interval: Duration, beats: u32, start: Instant) -> (PhiAccrualDetector, Instant) {
        let mut d = PhiAccrualDetector::new(&config(), interval);
        let mut at = start;
        for _ in 0..beats {
            d.heartbeat(at);
            at += interval;
        }
        (d, at - interval)
    }

    /// The first silence (in 10 ms steps) at which phi reaches `threshold`.
    fn silence_to(d: &PhiAccrualDetector, last: Instant, threshold: f64) -> Duration {
        (0..100_000u64)
            .map(|ms| Duration::from_millis(ms * 10))
            .find(|s| d.phi(last + *s) >= threshold)
            .expect("phi reaches the threshold")
    }

    #[test]
    fn phi_is_zero_before_any_heartbeat_and_grows_with_the_silence() {
        let start = Instant::now();
        let d = PhiAccrualDetector::new(&config(), Duration::from_secs(1));
        assert_eq!(d.phi(start + Duration::from_secs(60)), 0.0);
        let (d, last) = regular(Duration::from_secs(1), 30, start);
        let mut previous = -1.0;
        for s in [0, 1, 2, 3, 4, 5, 6, 8, 10, 30] {
            let p = d.phi(last + Duration::from_secs(s));
            assert!(p >= previous, "phi at {s} s is {p}, below {previous}");
            assert!(p.is_finite());
            previous = p;
        }
        assert!(
            d.phi(last) < 0.1,
            "right after a heartbeat: {}",
            d.phi(last)
        );
    }

    #[test]
    fn a_regular_1s_sender_is_suspected_after_the_acceptable_pause_and_not_before() {
        let (d, last) = regular(Duration::from_secs(1), 60, Instant::now());
        let at = silence_to(&d, last, 8.0);
        // Mean 1 s + 3 s of acceptable pause, std at its 100 ms floor: phi 8 lies about 5.6 std beyond 4 s.
        assert!(
            at > Duration::from_secs(4) && at < Duration::from_secs(5),
            "suspected after {at:?}"
        );
        assert!(d.phi(last + Duration::from_millis(3_900)) < 1.0);
    }

    #[test]
    fn an_irregular_sender_gets_more_slack_than_a_regular_one() {
        let start = Instant::now();
        let (regular_d, regular_last) = regular(Duration::from_secs(1), 60, start);
        let mut jittery = PhiAccrualDetector::new(&config(), Duration::from_secs(1));
        let mut at = start;
        for i in 0..60u64 {
            jittery.heartbeat(at);
            at += Duration::from_millis(if i % 2 == 0 { 400 } else { 1_600 });
        }
        let last = jittery.last_heartbeat().expect("it heartbeated");
        assert!(
            silence_to(&jittery, last, 8.0) > silence_to(&regular_d, regular_last, 8.0),
            "the same mean with a wider spread waits longer"
        );
    }

    #[test]
    fn early_heartbeats_count_as_life_but_leave_the_spread_of_the_regular_ones_alone() {
        let start = Instant::now();
        let (plain, plain_last) = regular(Duration::from_secs(1), 30, start);
        let mut mixed = PhiAccrualDetector::new(&config(), Duration::from_secs(1));
        let mut at = start;
        for i in 0..30u32 {
            mixed.heartbeat(at);
            if i % 3 == 0 {
                mixed.early_heartbeat(at + Duration::from_millis(20));
            }
            at += Duration::from_secs(1);
        }
        let last = mixed.last_heartbeat().expect("it heartbeated");
        assert_eq!(
            silence_to(&mixed, last, 8.0),
            silence_to(&plain, plain_last, 8.0),
            "early heartbeats changed the suspicion of a regular sender"
        );
        // One early heartbeat after the last regular one: the silence counts from it.
        mixed.early_heartbeat(last + Duration::from_millis(500));
        let early = mixed.last_heartbeat().expect("it heartbeated");
        assert_eq!(early, last + Duration::from_millis(500));
        assert!(
            mixed.phi(last + Duration::from_millis(4_600))
                < plain.phi(plain_last + Duration::from_millis(4_600))
        );
    }

    #[test]
    fn the_window_forgets_old_intervals() {
        let start = Instant::now();
        let mut d = PhiAccrualDetector::new(&config(), Duration::from_secs(10));
        let mut at = start;
        // Slow at first, then WINDOW intervals of 1 s: only the fast ones count.
        for _ in 0..10 {
            d.heartbeat(at);
            at += Duration::from_secs(10);
        }
        for _ in 0..=WINDOW {
            d.heartbeat(at);
            at += Duration::from_secs(1);
        }
        let last = d.last_heartbeat().expect("it heartbeated");
        assert!(silence_to(&d, last, 8.0) < Duration::from_secs(5));
        // A heartbeat arriving out of order (an earlier instant) moves nothing back.
        d.heartbeat(start);
        assert_eq!(d.last_heartbeat(), Some(last));
    }
}
