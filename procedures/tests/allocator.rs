//! The allocator the workspace's binaries and benches run with: mimalloc, built so that it does not ask the kernel
//! for transparent huge pages (`docs/procedures.md`, "The allocator"). Its own test binary, for its global
//! allocator. Linux only (it reads `/proc/self/smaps`).

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The `VmFlags` of the mapping of `/proc/self/smaps` that holds `address`.
fn vm_flags_of(address: usize) -> Option<Vec<String>> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let mut inside = false;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((start, end)) = first.split_once('-')
            && let (Ok(start), Ok(end)) = (
                usize::from_str_radix(start, 16),
                usize::from_str_radix(end, 16),
            )
        {
            inside = (start..end).contains(&address);
        } else if inside && let Some(flags) = line.strip_prefix("VmFlags:") {
            return Some(flags.split_whitespace().map(str::to_string).collect());
        }
    }
    None
}

/// mimalloc marks its arenas with `madvise(MADV_HUGEPAGE)` unless built with `no_thp`; the kernel shows that mark
/// as the `hg` flag of the mapping, whatever its own huge-page setting. A heap of small objects like the engine's
/// (records and procedure information) must live in mappings without it.
#[test]
fn the_heap_does_not_ask_for_transparent_huge_pages() {
    let objects: Vec<Vec<u8>> = (0..100_000).map(|i| vec![(i % 251) as u8; 600]).collect();
    let sampled = [0, objects.len() / 2, objects.len() - 1];
    for i in sampled {
        let address = objects[i].as_ptr() as usize;
        let flags = vm_flags_of(address)
            .unwrap_or_else(|| panic!("no mapping in /proc/self/smaps holds {address:#x}"));
        assert!(
            !flags.iter().any(|f| f == "hg"),
            "object {i} at {address:#x} lives in a mapping that asks for huge pages: VmFlags {flags:?}"
        );
    }
}
