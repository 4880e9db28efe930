//! The `engine_cpu` example on the system allocator (glibc's malloc) instead of mimalloc: `cargo run --release -p
//! procedures --example engine_cpu_system -- [STEPS] [COUNT] [waves|window]`. See `engine_cpu.rs` for what it prints.

#[path = "shared/engine_cpu.rs"]
mod engine_cpu;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    engine_cpu::run()
}
