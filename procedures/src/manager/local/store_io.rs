//! The local manager's store I/O: epoch-fenced writes retried under the store retry policy (showing `retrying`
//! while they are), reads, the epoch claim, and reading records back.

use std::collections::BTreeMap;

use backon::{BackoffBuilder, ExponentialBuilder};

use crate::config::RetryPolicy;
use crate::error::{Error, Result};
use crate::procedure::ProcedureId;
use crate::record::{EPOCH_KEY, ProcedureInfo, ProcedureState, RECORD_PREFIX, now_ms, record_key};
use crate::step_writes::StepWrites;
use crate::store::{Condition, WriteOp, WriteOutcome};

use super::Inner;
use super::recovery::decode_record;

/// How many times `start` re-reads the epoch when another manager claims it at the same moment.
const EPOCH_CLAIM_ATTEMPTS: usize = 5;
/// Records read per store request while recovering (`StateStore::scan_page`).
const RECOVERY_PAGE: usize = 1024;

impl Inner {
    /// One atomic write conditional on this manager's epoch (plus `conditions`), retried with the store retry
    /// policy while the store error is retryable. A refusal because the epoch moved is [`Error::Fenced`]; a
    /// refusal of one of the other `conditions` comes back as [`WriteOutcome::Rejected`].
    ///
    /// While the write is retried, the procedures in `shown` (those whose records it writes) show as `retrying`
    /// with the store's error; once the store answers, they show what they showed before (the caller then
    /// publishes the outcome). When the retries run out, the error is returned and the caller decides what shows.
    pub(crate) async fn write(
        &self,
        epoch: u64,
        conditions: Vec<Condition>,
        ops: Vec<WriteOp>,
        shown: &[ProcedureId],
    ) -> Result<WriteOutcome> {
        self.write_joined(epoch, conditions, &ops, None, shown)
            .await
    }

    /// [`Inner::write`] with a step's writes in the same commit (the store [joins](crate::StateStore::joins)
    /// them). A rejection lists the epoch, then `conditions`, then the step's conditions. `ops` are borrowed: each
    /// attempt hands the store a copy, and the caller keeps its own (a runner reuses its record's buffer).
    pub(crate) async fn write_joined(
        &self,
        epoch: u64,
        conditions: Vec<Condition>,
        ops: &[WriteOp],
        step: Option<&StepWrites>,
        shown: &[ProcedureId],
    ) -> Result<WriteOutcome> {
        let mut before: Option<Vec<(ProcedureId, ProcedureInfo)>> = None;
        let outcome = self
            .write_retried(epoch, conditions, ops, step, shown, &mut before)
            .await;
        if let (Ok(_), Some(before)) = (&outcome, before) {
            for (id, info) in before {
                self.with_entry(&id, |entry| entry.publish(info));
            }
        }
        outcome
    }

    pub(super) async fn write_retried(
        &self,
        epoch: u64,
        conditions: Vec<Condition>,
        ops: &[WriteOp],
        step: Option<&StepWrites>,
        shown: &[ProcedureId],
        before: &mut Option<Vec<(ProcedureId, ProcedureInfo)>>,
    ) -> Result<WriteOutcome> {
        let fence = || Condition::Equals {
            key: EPOCH_KEY.to_string(),
            value: epoch_bytes(epoch),
        };
        // Built when a write first fails (most never do).
        let mut retries = None;
        loop {
            if self.is_halted() {
                return Err(self.halt_error());
            }
            // Each attempt's conditions are its own (the store takes them): the fence first, then the caller's.
            let mut all = Vec::with_capacity(conditions.len() + 1);
            all.push(fence());
            all.extend(conditions.iter().cloned());
            let written = match step {
                Some(step) => self.store.write_with_step(all, ops.to_vec(), step).await,
                None => self.store.write(all, ops.to_vec()).await,
            };
            match written {
                Ok(WriteOutcome::Applied) => return Ok(WriteOutcome::Applied),
                Ok(WriteOutcome::Rejected { current }) => {
                    let now = current
                        .iter()
                        .find(|(key, _)| key == EPOCH_KEY)
                        .map(|(_, value)| value.as_deref().and_then(parse_epoch).unwrap_or(0));
                    return match now {
                        Some(now) if now != epoch => Err(Error::Fenced {
                            epoch: now,
                            own: epoch,
                        }),
                        _ => Ok(WriteOutcome::Rejected { current }),
                    };
                }
                Err(e) if e.is_retryable() => match retries
                    .get_or_insert_with(|| backoff(&self.config.store_retry))
                    .next()
                {
                    Some(delay) => {
                        tracing::warn!(procedures = ?shown, error = %e, ?delay, "retrying a state store write");
                        self.show_store_retry(shown, &e, before);
                        tokio::time::sleep(delay).await;
                    }
                    None => return Err(e),
                },
                Err(e) => return Err(e),
            }
        }
    }

    /// Shows every procedure of `shown` as `retrying` with the store error `e`; the first time, keeps what they
    /// showed in `before`.
    pub(super) fn show_store_retry(
        &self,
        shown: &[ProcedureId],
        e: &Error,
        before: &mut Option<Vec<(ProcedureId, ProcedureInfo)>>,
    ) {
        let mut state = self.state();
        let first = before.is_none();
        let kept = before.get_or_insert_with(Vec::new);
        let text = e.to_string();
        let now = now_ms();
        for id in shown {
            let Some(entry) = state.procedures.get_mut(id) else {
                continue;
            };
            if first {
                kept.push((id.clone(), entry.info_copy()));
            }
            let mut info = entry.info_copy();
            info.state = ProcedureState::Retrying;
            info.error = Some(text.clone());
            info.updated_at_ms = now;
            entry.publish(info);
        }
    }

    /// A read, retried like a write.
    pub(crate) async fn read<T, F, Fut>(&self, f: F) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        self.read_shown(&[], f).await
    }

    /// [`Inner::read`] made for a procedure: while the read is retried, the procedures in `shown` show as
    /// `retrying` with the store's error (as during a write), and once the store answers they show what they showed
    /// before. A runner reading at a step boundary is thus never silently stuck behind a store outage.
    pub(crate) async fn read_shown<T, F, Fut>(&self, shown: &[ProcedureId], f: F) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let mut backoff = backoff(&self.config.store_retry);
        let mut before: Option<Vec<(ProcedureId, ProcedureInfo)>> = None;
        let outcome = loop {
            match f().await {
                Err(e) if e.is_retryable() => match backoff.next() {
                    Some(delay) => {
                        if !shown.is_empty() {
                            tracing::warn!(procedures = ?shown, error = %e, ?delay, "retrying a state store read");
                            self.show_store_retry(shown, &e, &mut before);
                        }
                        tokio::time::sleep(delay).await;
                    }
                    None => break Err(e),
                },
                other => break other,
            }
        };
        if let (Ok(_), Some(before)) = (&outcome, before) {
            for (id, info) in before {
                self.with_entry(&id, |entry| entry.publish(info));
            }
        }
        outcome
    }

    /// Claims the epoch through the store ([`StateStore::claim_epoch`]), trying again while another manager
    /// changes the epoch key at the same time.
    pub(super) async fn claim_epoch(&self) -> Result<u64> {
        for _ in 0..EPOCH_CLAIM_ATTEMPTS {
            if let Some(epoch) = self.read(|| self.store.claim_epoch()).await? {
                return Ok(epoch);
            }
            tracing::debug!("another manager claimed the epoch at the same time; retrying");
        }
        Err(Error::ManagerNotRunning {
            reason: format!(
                "could not claim an epoch: '{EPOCH_KEY}' changed under every one of {EPOCH_CLAIM_ATTEMPTS} attempts"
            ),
        })
    }

    /// Every procedure record, read [`RECOVERY_PAGE`] keys at a time (each page retried like any read), so no
    /// single request to the store carries every record.
    pub(super) async fn read_records(&self) -> Result<Vec<(String, Vec<u8>)>> {
        let mut records: Vec<(String, Vec<u8>)> = Vec::new();
        loop {
            let after = records.last().map(|(key, _)| key.clone());
            let page = self
                .read(|| {
                    self.store
                        .scan_page(RECORD_PREFIX, after.as_deref(), RECOVERY_PAGE)
                })
                .await?;
            if page.is_empty() {
                return Ok(records);
            }
            records.extend(page);
        }
    }

    /// A finished procedure that is not in memory (it left after `finished_in_memory`, or was not loaded at start),
    /// read from its record. `None` when the store has no record under `id`, or one that is not finished (this
    /// manager knows every unfinished procedure it runs).
    pub(crate) async fn stored_finished(&self, id: &ProcedureId) -> Result<Option<ProcedureInfo>> {
        let key = record_key(id);
        let Some(value) = self.read(|| self.store.get(&key)).await? else {
            return Ok(None);
        };
        let record = decode_record(&key, &value)?;
        if record.id != *id {
            return Err(Error::CorruptRecord {
                id: id.clone(),
                type_name: record.type_name.clone(),
                key,
                reason: format!(
                    "the record names procedure {}, not the one of its key",
                    record.id
                ),
            });
        }
        Ok(record
            .state
            .is_finished()
            .then(|| ProcedureInfo::from(&record)))
    }

    /// Every finished procedure of the store that is not in `known`, read [`RECOVERY_PAGE`] records at a time. A
    /// record that cannot be read is left out (logged): this manager shows the damaged records it loaded at start.
    pub(crate) async fn stored_finished_except(
        &self,
        known: &BTreeMap<ProcedureId, ProcedureInfo>,
    ) -> Result<Vec<ProcedureInfo>> {
        let mut found = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = self
                .read(|| {
                    self.store
                        .scan_page(RECORD_PREFIX, after.as_deref(), RECOVERY_PAGE)
                })
                .await?;
            let Some((last, _)) = page.last() else {
                return Ok(found);
            };
            after = Some(last.clone());
            for (key, value) in page {
                let key_id = ProcedureId::new(key.strip_prefix(RECORD_PREFIX).unwrap_or(&key));
                if known.contains_key(&key_id) {
                    continue;
                }
                match decode_record(&key, &value) {
                    Ok(record) if record.id == key_id && record.state.is_finished() => {
                        found.push(ProcedureInfo::from(&record));
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "a procedure record cannot be listed"),
                }
            }
        }
    }
}

/// An epoch as the epoch key holds it: its decimal digits (written without the formatting machinery: a fenced
/// write makes one per attempt).
pub(crate) fn epoch_bytes(epoch: u64) -> Vec<u8> {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = epoch;
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    digits[at..].to_vec()
}

/// The epoch an epoch key's value names; `None` when it is not a number.
pub(crate) fn parse_epoch(bytes: &[u8]) -> Option<u64> {
    std::str::from_utf8(bytes).ok()?.trim().parse().ok()
}

/// The exponential backoff with jitter of `policy`.
pub(crate) fn backoff(policy: &RetryPolicy) -> impl Iterator<Item = std::time::Duration> + use<> {
    ExponentialBuilder::default()
        .with_min_delay(policy.initial_delay)
        .with_max_delay(policy.max_delay)
        .with_factor(policy.factor)
        .with_max_times(policy.max_retries)
        .with_jitter()
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The epoch's bytes are its decimal text, as `to_string` writes it and `parse_epoch` reads it back.
    #[test]
    fn an_epochs_bytes_are_its_decimal_text() {
        for epoch in [
            0,
            1,
            9,
            10,
            99,
            100,
            12_345,
            u64::from(u32::MAX),
            u64::MAX - 1,
            u64::MAX,
        ] {
            assert_eq!(
                epoch_bytes(epoch),
                epoch.to_string().into_bytes(),
                "{epoch}"
            );
            assert_eq!(parse_epoch(&epoch_bytes(epoch)), Some(epoch));
        }
    }
}
