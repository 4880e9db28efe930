//! Bounded listings of procedures: a page of at most `limit` procedures, newest first, filtered by state and type,
//! with a cursor for the next page.
//!
//! A manager may retain tens of thousands of finished procedures; answering all of them to every listing (an API
//! call, the operator page on each refresh) costs megabytes. [`page`] cuts a listing down to what was asked for and
//! counts, per state, every procedure that matched the filters, so a caller can still say "19,998 done, 2 failed"
//! while it shows a hundred.
//!
//! The order is newest first: by submission time, then by id (both descending), so it is total and stable while
//! procedures are added or purged. A [`Cursor`] names the last procedure of a page by that pair; the next page
//! starts strictly after it, whether or not that procedure still exists.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crate::record::{ProcedureInfo, ProcedureState};

/// The page size when none is asked for.
pub const DEFAULT_LIMIT: usize = 100;

/// The largest page size a caller may ask for.
pub const MAX_LIMIT: usize = 1000;

/// The longest cursor accepted (a submission time, a colon, and an id of at most 128 bytes, with room to spare).
const MAX_CURSOR_LEN: usize = 160;

/// A position in the newest-first order: the submission time and id of the last procedure of a page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cursor {
    created_at_ms: u64,
    id: String,
}

impl Cursor {
    /// The cursor just past `info`.
    pub fn after(info: &ProcedureInfo) -> Cursor {
        Cursor {
            created_at_ms: info.created_at_ms,
            id: info.id.as_str().to_string(),
        }
    }

    /// Whether `info` comes after this cursor in the newest-first order.
    pub fn precedes(&self, info: &ProcedureInfo) -> bool {
        (info.created_at_ms, info.id.as_str()) < (self.created_at_ms, self.id.as_str())
    }
}

/// Written as `<created_at_ms>:<id>`.
impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.created_at_ms, self.id)
    }
}

impl FromStr for Cursor {
    type Err = ListQueryError;

    fn from_str(s: &str) -> Result<Cursor, ListQueryError> {
        let bad = |why: &str| ListQueryError {
            field: "after",
            message: format!(
                "{why}; a cursor is the `next` of a previous page, `<submission ms>:<procedure id>`"
            ),
        };
        if s.len() > MAX_CURSOR_LEN {
            return Err(bad(&format!(
                "the cursor is {} bytes, at most {MAX_CURSOR_LEN} are accepted",
                s.len()
            )));
        }
        let Some((ms, id)) = s.split_once(':') else {
            return Err(bad("the cursor has no ':'"));
        };
        let created_at_ms = ms
            .parse()
            .map_err(|_| bad("the cursor does not start with a number of milliseconds"))?;
        Ok(Cursor {
            created_at_ms,
            id: id.to_string(),
        })
    }
}

/// What a listing asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListQuery {
    /// At most this many procedures (1..=[`MAX_LIMIT`]).
    pub limit: usize,
    /// Start after this position (the `next` of the previous page).
    pub after: Option<Cursor>,
    /// Only procedures in one of these states (any state when empty).
    pub states: Vec<ProcedureState>,
    /// Only procedures of this type.
    pub type_name: Option<String>,
}

impl Default for ListQuery {
    fn default() -> ListQuery {
        ListQuery {
            limit: DEFAULT_LIMIT,
            after: None,
            states: Vec::new(),
            type_name: None,
        }
    }
}

/// A listing request that cannot be answered, naming the field at fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListQueryError {
    /// The field: `limit`, `after`, `state` or `type`.
    pub field: &'static str,
    /// What is wrong with it.
    pub message: String,
}

impl fmt::Display for ListQueryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid `{}`: {}", self.field, self.message)
    }
}

impl std::error::Error for ListQueryError {}

impl ListQuery {
    /// Builds a query from its text form (an HTTP query string's values, or command-line flags): `limit` a number,
    /// `after` a cursor, `state` one or more state names separated by commas, `type` a type name. Each absent
    /// field takes its default.
    pub fn parse(
        limit: Option<&str>,
        after: Option<&str>,
        state: Option<&str>,
        type_name: Option<&str>,
    ) -> Result<ListQuery, ListQueryError> {
        let limit = match limit {
            None => DEFAULT_LIMIT,
            Some(text) => {
                let shown: String = text.chars().take(20).collect();
                let n: usize = text.parse().map_err(|_| ListQueryError {
                    field: "limit",
                    message: format!("'{shown}' is not a number from 1 to {MAX_LIMIT}"),
                })?;
                if !(1..=MAX_LIMIT).contains(&n) {
                    return Err(ListQueryError {
                        field: "limit",
                        message: format!("{n} is not from 1 to {MAX_LIMIT}"),
                    });
                }
                n
            }
        };
        let after = after.map(str::parse).transpose()?;
        let mut states = Vec::new();
        for name in state.into_iter().flat_map(|s| s.split(',')) {
            let name = name.trim();
            if name.is_empty() {
                continue;
            }
            let state = ProcedureState::ALL
                .into_iter()
                .find(|s| s.as_str() == name)
                .ok_or_else(|| ListQueryError {
                    field: "state",
                    message: format!(
                        "'{}' is not a state; the states are {}",
                        name.chars().take(40).collect::<String>(),
                        ProcedureState::ALL.map(ProcedureState::as_str).join(", ")
                    ),
                })?;
            if !states.contains(&state) {
                states.push(state);
            }
        }
        let type_name = type_name.filter(|t| !t.is_empty()).map(str::to_string);
        Ok(ListQuery {
            limit,
            after,
            states,
            type_name,
        })
    }

    /// Whether `info` passes the state and type filters (the cursor and limit aside).
    pub fn matches(&self, info: &ProcedureInfo) -> bool {
        (self.states.is_empty() || self.states.contains(&info.state))
            && self
                .type_name
                .as_deref()
                .is_none_or(|t| t == info.type_name)
    }
}

/// One page of a listing.
#[derive(Clone, Debug, PartialEq)]
pub struct ListPage {
    /// The procedures, newest first.
    pub procedures: Vec<ProcedureInfo>,
    /// Where the next page starts; `None` on the last page.
    pub next: Option<Cursor>,
    /// How many procedures matched the state and type filters, cursor aside.
    pub matched: usize,
    /// Those matches per state name.
    pub counts: BTreeMap<&'static str, usize>,
}

/// Cuts `list` (any order) down to the page `query` asks for.
pub fn page(list: Vec<ProcedureInfo>, query: &ListQuery) -> ListPage {
    let mut counts = BTreeMap::new();
    let mut kept: Vec<ProcedureInfo> = Vec::new();
    let mut matched = 0;
    for info in list {
        if !query.matches(&info) {
            continue;
        }
        matched += 1;
        *counts.entry(info.state.as_str()).or_insert(0) += 1;
        if query.after.as_ref().is_none_or(|c| c.precedes(&info)) {
            kept.push(info);
        }
    }
    newest_first(&mut kept);
    let next = (kept.len() > query.limit).then(|| Cursor::after(&kept[query.limit - 1]));
    kept.truncate(query.limit);
    ListPage {
        procedures: kept,
        next,
        matched,
        counts,
    }
}

/// Sorts newest first: submission time, then id, both descending.
pub fn newest_first(list: &mut [ProcedureInfo]) {
    list.sort_by(|a, b| (b.created_at_ms, b.id.as_str()).cmp(&(a.created_at_ms, a.id.as_str())));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ProcedureId;

    fn info(id: &str, created_at_ms: u64, state: ProcedureState, type_name: &str) -> ProcedureInfo {
        ProcedureInfo {
            id: ProcedureId::new(id),
            type_name: type_name.to_string(),
            parent_id: None,
            state,
            step: 0,
            output: None,
            error: None,
            created_at_ms,
            updated_at_ms: created_at_ms,
            step_name: None,
            attempt: 0,
            last_error: None,
            next_retry_at_ms: None,
            step_started_at_ms: None,
            lock_keys: Vec::new(),
            locks_held: Vec::new(),
            lock_wait: None,
            events: Vec::new(),
            refusal: None,
        }
    }

    fn ids(page: &ListPage) -> Vec<&str> {
        page.procedures.iter().map(|p| p.id.as_str()).collect()
    }

    #[test]
    fn pages_walk_every_procedure_once_newest_first() {
        // Two procedures share a submission time: the id breaks the tie, so no page repeats or skips one.
        let list = vec![
            info("a", 1, ProcedureState::Done, "T"),
            info("c", 3, ProcedureState::Done, "T"),
            info("b2", 2, ProcedureState::Done, "T"),
            info("b1", 2, ProcedureState::Failed, "T"),
            info("d", 4, ProcedureState::Running, "T"),
        ];
        let mut query = ListQuery {
            limit: 2,
            ..ListQuery::default()
        };
        let mut seen = Vec::new();
        loop {
            let p = page(list.clone(), &query);
            assert_eq!(p.matched, 5);
            seen.extend(ids(&p).into_iter().map(str::to_string));
            match p.next {
                Some(next) => query.after = Some(next.to_string().parse().unwrap()),
                None => break,
            }
        }
        assert_eq!(seen, ["d", "c", "b2", "b1", "a"]);
    }

    #[test]
    fn a_cursor_whose_procedure_was_purged_still_places_the_next_page() {
        let list = vec![
            info("a", 1, ProcedureState::Done, "T"),
            info("c", 3, ProcedureState::Done, "T"),
        ];
        let query = ListQuery {
            after: Some("2:b".parse().unwrap()),
            ..ListQuery::default()
        };
        assert_eq!(ids(&page(list, &query)), ["a"]);
    }

    #[test]
    fn filters_count_only_what_they_match() {
        let list = vec![
            info("a", 1, ProcedureState::Done, "CreateTable"),
            info("b", 2, ProcedureState::Failed, "CreateTable"),
            info("c", 3, ProcedureState::Failed, "WalPrune"),
            info("d", 4, ProcedureState::Stalled, "CreateTable"),
        ];
        let query =
            ListQuery::parse(None, None, Some("failed,stalled"), Some("CreateTable")).unwrap();
        let p = page(list, &query);
        assert_eq!(ids(&p), ["d", "b"]);
        assert_eq!(p.matched, 2);
        assert_eq!(p.counts, BTreeMap::from([("failed", 1), ("stalled", 1)]));
        assert_eq!(p.next, None);
    }

    #[test]
    fn bad_fields_are_refused_naming_them_without_echoing_them_whole() {
        let err = ListQuery::parse(Some("0"), None, None, None).unwrap_err();
        assert_eq!(err.to_string(), "invalid `limit`: 0 is not from 1 to 1000");
        let err = ListQuery::parse(Some("1001"), None, None, None).unwrap_err();
        assert_eq!(err.field, "limit");
        let long = "x".repeat(100_000);
        let err = ListQuery::parse(Some(&long), None, None, None).unwrap_err();
        assert!(err.to_string().len() < 100, "{err}");
        let err = ListQuery::parse(None, None, Some(&long), None).unwrap_err();
        assert_eq!(err.field, "state");
        assert!(err.to_string().len() < 200, "{err}");
        let err = ListQuery::parse(None, None, Some("done,finished"), None).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("invalid `state`: 'finished' is not a state"),
            "{err}"
        );
        let err = ListQuery::parse(None, Some("abc"), None, None).unwrap_err();
        assert_eq!(err.field, "after");
        let err = ListQuery::parse(None, Some("x:abc"), None, None).unwrap_err();
        assert_eq!(err.field, "after");
        let err = ListQuery::parse(None, Some(&format!("1:{long}")), None, None).unwrap_err();
        assert!(err.to_string().len() < 200, "{err}");
    }

    #[test]
    fn a_cursor_round_trips_through_its_text_even_when_the_id_has_colons() {
        let c = Cursor::after(&info("table:a:b", 17, ProcedureState::Done, "T"));
        let back: Cursor = c.to_string().parse().unwrap();
        assert_eq!(back, c);
        assert_eq!(back.id, "table:a:b");
    }
}
