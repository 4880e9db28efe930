//! CPU time per procedure of the engine on `MemoryStateStore`: `cargo run --release -p procedures --example
//! engine_cpu -- [STEPS] [COUNT] [waves|window|one]` runs COUNT (default 150,000) procedures of STEPS (default 1)
//! persisted steps, 64 in flight (1 with `one`) from a submitter outside the runtime, after 20,000 to warm up, and prints
//! procedures per second and the process's CPU time (user + system, from `/proc/self/stat`) per procedure. Then,
//! in the same process, its anchor: the same records written to a store of their own by a bare task per
//! procedure, with no manager (waves of 64), and how many times that CPU the engine took.
//! `waves` (the default, the shape of the `procedures` bench) submits 64 and waits for all of them before the next
//! 64; `window` submits the next one as soon as one finishes, so 64 are always in flight; `one` submits one and
//! waits for it before the next (its anchor then writes one procedure at a time too). On a shared machine the
//! CPU time moves less than the throughput between runs, so it is the figure to compare two builds by. Linux only.
//!
//! With `ENGINE_CPU_ONLY=engine` (or `writes`) in its environment it runs that half alone, warm-up included (the
//! writes half then prints nothing): `scripts/engine_instructions.sh` counts the instructions of each half under
//! callgrind, a figure that does not move with the machine's load (but leaves out the kernel's work and the cost of
//! cache misses).
//!
//! It runs with mimalloc, the allocator `walctl` and the benches use; `--example engine_cpu_system` is the same run
//! on the system allocator (glibc's malloc), to compare the two.

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "shared/engine_cpu.rs"]
mod engine_cpu;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    engine_cpu::run()
}
