//! What a finished procedure keeps in memory. A manager keeps finished procedures (for their watchers and
//! introspection) and the memory store keeps their records until retention forgets them, so every byte a finished
//! procedure holds is multiplied by the number a busy manager finishes in its retention window. This binary counts
//! the heap's live bytes with its own global allocator (hence a test binary of its own).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, Ordering};

use procedures::testing::run_steps;
use procedures::{LocalManager, ManagerConfig, MemoryStateStore, ProcedureId, ProcedureManager};

/// The system allocator, counting the bytes allocated and not yet freed.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call forwards to `System` with the same arguments; the counter is only arithmetic on the side.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded as is.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded as is.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: forwarded as is.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `count` procedures of `steps` persisted steps, 64 in flight, and waits for every one.
async fn run(manager: &LocalManager, first: usize, count: usize, steps: u32) {
    for chunk in (first..first + count).collect::<Vec<_>>().chunks(64) {
        let ids = chunk
            .iter()
            .map(|i| ProcedureId::new(format!("memory-{i:06}")));
        run_steps(manager, ids, steps, true).await.unwrap();
    }
}

/// Held by a test while it measures: the count of live bytes is the whole process's, so the tests of this binary
/// measure one at a time.
static MEASURING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The heap a finished procedure of `steps` persisted steps keeps, averaged over `count` of them.
async fn kept_per_procedure(steps: u32, count: usize) -> isize {
    let _alone = MEASURING.lock().await;
    let store = Arc::new(MemoryStateStore::new());
    let manager = LocalManager::new(store, ManagerConfig::default());
    manager.start().await.unwrap();
    // Warm up: the runtime's, the manager's and the map's first allocations are not a procedure's.
    run(&manager, 0, 256, steps).await;
    let before = LIVE.load(Ordering::Relaxed);
    run(&manager, 256, count, steps).await;
    let after = LIVE.load(Ordering::Relaxed);
    manager.stop().await.unwrap();
    (after - before) / count as isize
}

/// A finished procedure keeps its information (state, output, history) and the store its record: under 1,900 bytes
/// of heap for the smallest persisted procedure (about 1,700 in debug and release builds; it was about 2,040 while
/// a finished procedure kept its watch channel, and about 7,600 while it kept its runner's task). (The manager also holds no handle to a runner's task once it ends:
/// in a release build the task is a few kilobytes, but a debug build boxes a future that large, so this test, in a
/// debug build, would not see a task kept.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_one_step_procedure_keeps_under_1900_bytes_of_heap() {
    let per_procedure = kept_per_procedure(1, 2_000).await;
    eprintln!("a finished one-step procedure keeps {per_procedure} bytes on the heap");
    assert!(
        per_procedure < 1_900,
        "a finished procedure keeps {per_procedure} bytes on the heap"
    );
}

/// A longer history is kept at its length, not with the room it had to grow while the procedure ran: a finished
/// 16-step procedure (34 events, in memory and in its record) keeps under 6,200 bytes of heap with its record
/// (about 5,700; about 7,700 while the history moved into the finished state kept its spare capacity, room for 64).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_sixteen_step_procedure_keeps_its_history_without_room_to_grow() {
    let per_procedure = kept_per_procedure(16, 1_000).await;
    eprintln!("a finished 16-step procedure keeps {per_procedure} bytes on the heap");
    assert!(
        per_procedure < 6_200,
        "a finished 16-step procedure keeps {per_procedure} bytes on the heap"
    );
}
