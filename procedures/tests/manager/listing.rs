//! Bounded listings over a manager that retains many finished procedures: the default page holds
//! [`DEFAULT_LIMIT`] of 20,000 whatever their number, and walking the pages visits each procedure exactly once,
//! newest first, while procedures keep finishing between the pages.

use std::collections::HashSet;
use std::sync::Arc;

use procedures::listing::{DEFAULT_LIMIT, ListQuery, page};
use procedures::testing::run_steps;
use procedures::{LocalManager, ManagerConfig, MemoryStateStore, ProcedureId, ProcedureManager};

const RETAINED: usize = 20_000;

#[tokio::test]
async fn the_default_page_of_20000_retained_procedures_holds_100_and_the_pages_visit_each_once() {
    let manager = LocalManager::new(Arc::new(MemoryStateStore::new()), ManagerConfig::default());
    manager.start().await.unwrap();
    let ids = (0..RETAINED).map(|i| ProcedureId::new(format!("p-{i:05}")));
    run_steps(&manager, ids, 1, true).await.unwrap();

    let all = manager.list_procedures().await.unwrap();
    assert_eq!(all.len(), RETAINED);
    let largest = all
        .iter()
        .map(|info| serde_json::to_string(info).unwrap().len())
        .max()
        .unwrap();
    let whole = serde_json::to_string(&all).unwrap().len();

    let first = page(all, &ListQuery::default());
    assert_eq!(first.procedures.len(), DEFAULT_LIMIT);
    assert_eq!(first.matched, RETAINED);
    assert_eq!(first.counts.get("done"), Some(&RETAINED));
    let size = serde_json::to_string(&first.procedures).unwrap().len();
    // A JSON array of n records: their bytes, n - 1 commas and two brackets.
    assert!(
        size < DEFAULT_LIMIT * (largest + 1) + 2,
        "the default page is {size} bytes, more than {DEFAULT_LIMIT} records of at most {largest}"
    );
    assert!(
        size * 100 < whole,
        "the page ({size} B) is not a small part of the whole ({whole} B)"
    );

    // Walk every page of 1,000; more procedures finish between the pages, and they are newer than the cursor, so
    // the walk neither repeats nor skips one of those it started with.
    let mut query = ListQuery::parse(Some("1000"), None, None, None).unwrap();
    let mut seen = HashSet::new();
    let mut last: Option<(u64, String)> = None;
    let mut pages = 0;
    loop {
        let list = manager.list_procedures().await.unwrap();
        let p = page(list, &query);
        pages += 1;
        for info in &p.procedures {
            let key = (info.created_at_ms, info.id.to_string());
            if let Some(previous) = &last {
                assert!(key < *previous, "{key:?} is not older than {previous:?}");
            }
            last = Some(key);
            assert!(seen.insert(info.id.to_string()), "{} listed twice", info.id);
        }
        let Some(next) = p.next else { break };
        query.after = Some(next.to_string().parse().unwrap());
        let extra = ProcedureId::new(format!("late-{pages}"));
        run_steps(&manager, [extra], 1, true).await.unwrap();
    }
    assert_eq!(pages, RETAINED / 1000);
    assert_eq!(seen.len(), RETAINED);
    assert!(seen.iter().all(|id| id.starts_with("p-")));
    manager.stop().await.unwrap();
}
