//! DESIGN.md's experiment on the CPU backend in sanitizer mode: the deliberately unordered
//! upload is caught every time, and the Device API path sees 0 stale tables.

#![allow(clippy::unwrap_used, clippy::expect_used)]
use strata_backend_cpu::{CpuOptions, device};
use strata_core::{Args, Error, HazardKind, KernelId, LaunchCfg};

const N: usize = 96 * 1024 / 4;
const ITERATIONS: u32 = 2000;

/// One experiment at a time: the unordered run's findings depend on how its detached
/// uploads interleave with the reader, so it runs without the other tests' devices beside it.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn sanitized() -> strata_core::Device {
    device(CpuOptions {
        sanitize: true,
        max_dma_delay_us: 100,
        ..Default::default()
    })
    .expect("cpu device")
}

/// Launches `CheckTable` on `stream`: flags[slot] becomes 1 when any of the table's values
/// differs from `expected`. Returns the launch's site, the one a finding names.
#[track_caller]
fn check_table(
    dev: &strata_core::Device,
    table: &strata_core::DeviceBuffer<i32>,
    flags: &strata_core::DeviceBuffer<u32>,
    expected: i32,
    slot: u32,
    stream: strata_core::Stream,
) -> String {
    dev.launch(
        KernelId::CheckTable,
        &LaunchCfg::linear(N, 256),
        &Args::new()
            .read(table)
            .write(flags)
            .u32(N as u32)
            .i32(expected)
            .u32(slot),
        stream,
    )
    .unwrap();
    std::panic::Location::caller().to_string()
}

/// What one unordered run saw.
struct Outcome {
    /// Readers that saw a table other than their own upload's.
    stale: u32,
    /// Readers that ran after some upload had landed (the table was no longer zero).
    landed: u32,
    /// Read-after-write findings naming the landed check's launch.
    landed_findings: usize,
    /// Write-after-read findings: an upload landing after reads it was not ordered with.
    write_after_read: usize,
    hazards: usize,
}

fn unordered_run(dev: &strata_core::Device) -> Outcome {
    let reader = dev.create_stream().unwrap();
    // Zeroed at allocation; every upload below writes i + 1, so zero means "none landed".
    let table = dev.alloc::<i32>(N).unwrap();
    let stale_flags = dev.alloc::<u32>(ITERATIONS as usize).unwrap();
    let landed_flags = dev.alloc::<u32>(ITERATIONS as usize).unwrap();
    let zeros = vec![0u32; ITERATIONS as usize];
    dev.upload(&stale_flags, &zeros, reader).unwrap();
    dev.upload(&landed_flags, &zeros, reader).unwrap();
    let mut landed_site = String::new();
    for i in 0..ITERATIONS {
        let value = i as i32 + 1;
        dev.upload_unordered(&table, &vec![value; N]).unwrap();
        check_table(dev, &table, &stale_flags, value, i, reader);
        landed_site = check_table(dev, &table, &landed_flags, 0, i, reader);
    }
    // Let everything land; the findings come back as the synchronisation's error.
    let mut found = match dev.synchronize() {
        Err(Error::Hazards(h)) => h,
        Err(e) => panic!("{e}"),
        Ok(()) => Vec::new(),
    };
    found.extend(dev.take_hazards());
    let count = |flags: &strata_core::DeviceBuffer<u32>| {
        let seen = dev.download(flags, reader).unwrap().wait().unwrap();
        seen.iter().filter(|&&f| f != 0).count() as u32
    };
    Outcome {
        stale: count(&stale_flags),
        landed: count(&landed_flags),
        landed_findings: found
            .iter()
            .filter(|h| h.kind == HazardKind::ReadAfterWrite && h.site == landed_site)
            .count(),
        write_after_read: found
            .iter()
            .filter(|h| h.kind == HazardKind::WriteAfterRead)
            .count(),
        hazards: found.len(),
    }
}

#[test]
fn unordered_upload_is_caught_every_time() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for run in 0..2 {
        let dev = sanitized();
        let o = unordered_run(&dev);
        eprintln!(
            "unordered upload, run {run}: {} of {ITERATIONS} readers saw a stale table, {} ran after an upload had landed; sanitizer reported {} hazards ({} on the landed check, {} write-after-read)",
            o.stale, o.landed, o.hazards, o.landed_findings, o.write_after_read
        );
        // The sanitizer keeps a buffer's last write and each stream's last read since it.
        // The reader never waits on the upload queue, so every read that ran after an
        // upload had landed is its own finding, exactly: it checks under the data lock.
        assert_eq!(
            o.landed_findings, o.landed as usize,
            "a read after an unordered upload went unreported (or a read before any upload was reported)"
        );
        // A read that ran before every upload is named when the first upload lands.
        if o.landed < ITERATIONS {
            assert!(
                o.write_after_read >= 1,
                "reads ran before the first upload landed and no upload was reported after them"
            );
        }
        assert!(
            o.stale > 0,
            "with the simulated DMA delay some readers must see the old table"
        );
    }
}

#[test]
fn device_api_upload_has_no_stale_reads_and_no_findings() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dev = sanitized();
    for loaded in [false, true] {
        let stale = strata_core::conformance::table_experiment(&dev, ITERATIONS, loaded).unwrap();
        eprintln!(
            "Device API upload (loaded: {loaded}): {stale} of {ITERATIONS} readers saw a stale table"
        );
        assert_eq!(stale, 0);
    }
    assert!(dev.take_hazards().is_empty());
}

#[test]
fn a_core_that_forgets_its_waits_is_caught() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // Mutant: core inserts no cross-stream waits. The sanitizer must name the unordered
    // read in the very first conformance test that crosses streams.
    let dev = sanitized();
    dev.disable_ordering_for_test();
    let err = strata_core::conformance::upload_then_read_on_other_stream(&dev)
        .expect_err("the sanitizer must reject a core without ordering");
    let hazards = match err {
        Error::Hazards(h) => h,
        // The reads can run before the uploads' delayed copies land: the test's value check
        // then fails first, and the sanitizer names the pair when a copy lands (a write
        // after the unordered read), by the time the device is idle.
        Error::Capture(_) => match dev.synchronize() {
            Err(Error::Hazards(h)) => h,
            _ => dev.take_hazards(),
        },
        other => panic!("expected sanitizer findings, got: {other}"),
    };
    assert!(!hazards.is_empty(), "no sanitizer findings");
    assert!(
        hazards
            .iter()
            .any(|h| h.kind == HazardKind::ReadAfterWrite || h.kind == HazardKind::WriteAfterRead)
    );
    // Both sites are named, and they are the conformance suite's call sites.
    assert!(hazards[0].site.contains("conformance.rs"), "{}", hazards[0]);
    assert!(
        hazards[0].other_site.contains("conformance.rs"),
        "{}",
        hazards[0]
    );
}
