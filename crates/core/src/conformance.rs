//! The conformance suite, written once and run by every backend through
//! [`conformance_tests!`](crate::conformance_tests). Each test ends with a host
//! synchronisation, which also returns any sanitizer finding as an error.

use crate::{Args, Device, Error, KernelId, LaunchCfg, Result};

mod argmax;
mod kv_q8;
pub use argmax::argmax_rows;
pub use kv_q8::int8_kv_cache;

const BLOCK: u32 = 256;

fn fill(dev: &Device, buf: &crate::DeviceBuffer<u32>, value: u32, s: crate::Stream) -> Result<()> {
    let n = buf.len();
    dev.launch(
        KernelId::FillU32,
        &LaunchCfg::linear(n, BLOCK),
        &Args::new().write(buf).u32(n as u32).u32(value),
        s,
    )
}

fn add(
    dev: &Device,
    src: &crate::DeviceBuffer<u32>,
    dst: &crate::DeviceBuffer<u32>,
    addend: u32,
    s: crate::Stream,
) -> Result<()> {
    let n = src.len().min(dst.len());
    dev.launch(
        KernelId::AddU32,
        &LaunchCfg::linear(n, BLOCK),
        &Args::new().read(src).write(dst).u32(n as u32).u32(addend),
        s,
    )
}

fn busy(dev: &Device, sink: &crate::DeviceBuffer<u32>, ns: u64, s: crate::Stream) -> Result<()> {
    dev.launch(
        KernelId::BusyWait,
        &LaunchCfg::linear(1, 1),
        &Args::new().read_write(sink).u64(ns),
        s,
    )
}

fn expect_all(got: &[u32], want: u32, what: &str) -> Result<()> {
    match got.iter().position(|&v| v != want) {
        None => Ok(()),
        Some(i) => Err(Error::Capture(format!(
            "conformance failure ({what}): element {i} is {} instead of {want}",
            got[i]
        ))),
    }
}

/// An upload on one stream is seen by a kernel on another, every time.
pub fn upload_then_read_on_other_stream(dev: &Device) -> Result<()> {
    let copy = dev.create_stream()?;
    let compute = dev.create_stream()?;
    let n = 24 * 1024;
    let table = dev.alloc::<u32>(n)?;
    let out = dev.alloc::<u32>(n)?;
    let sink = dev.alloc::<u32>(1)?;
    for i in 0..64u32 {
        // Keep the reader's stream busy sometimes, the copy stream other times.
        if i % 2 == 0 {
            busy(dev, &sink, 20_000, compute)?;
        }
        dev.upload(&table, &vec![i; n], copy)?;
        add(dev, &table, &out, 1, compute)?;
        let got = dev.download(&out, compute)?.wait()?;
        expect_all(&got, i + 1, "upload then read")?;
    }
    dev.synchronize()
}

/// A large upload (copied into staging by several threads) lands whole, at an offset,
/// and the next one through the same staging does not disturb it.
pub fn large_upload_lands_whole(dev: &Device) -> Result<()> {
    let s = dev.main_stream();
    // Not a multiple of the per-thread chunk, so the last thread's part is short.
    let n = (37 << 20) / 4 + 123;
    let buf = dev.alloc::<u32>(n + 7)?;
    for round in 0..2u32 {
        let data: Vec<u32> = (0..n as u32)
            .map(|i| i.wrapping_mul(2_654_435_761) ^ round)
            .collect();
        dev.upload_at(&buf, 7, &data, s)?;
        let got = dev.download(&buf, s)?.wait()?;
        if let Some(i) = (0..n).find(|&i| got[7 + i] != data[i]) {
            return Err(Error::Capture(format!(
                "conformance failure (large upload): round {round}: element {i} is {:#x}, expected {:#x}",
                got[7 + i],
                data[i]
            )));
        }
    }
    dev.synchronize()
}

/// Pieces uploaded together (one staging buffer filled by several threads) land at their
/// offsets, and nothing between them changes.
pub fn ranged_upload_lands_in_place(dev: &Device) -> Result<()> {
    let s = dev.main_stream();
    let n = (40 << 20) / 4;
    let buf = dev.alloc::<u32>(n)?;
    let mut want = vec![0xDEAD_BEEF_u32; n];
    dev.upload(&buf, &want, s)?;
    // Sizes from a few words to several per-thread chunks, gaps between them.
    let sizes = [3usize, 1 << 20, 5, (3 << 20) + 17, 1000, 2 << 20, 1];
    let mut pieces = Vec::new();
    let mut at = 11;
    for (j, &len) in sizes.iter().enumerate() {
        let data: Vec<u32> = (0..len as u32).map(|i| i ^ ((j as u32) << 24)).collect();
        want[at..at + len].copy_from_slice(&data);
        pieces.push((at, data));
        at += len + 4099;
    }
    let refs: Vec<(usize, &[u32])> = pieces.iter().map(|(o, d)| (*o, d.as_slice())).collect();
    dev.upload_ranges(&buf, &refs, s)?;
    let got = dev.download(&buf, s)?.wait()?;
    if let Some(i) = (0..n).find(|&i| got[i] != want[i]) {
        return Err(Error::Capture(format!(
            "conformance failure (ranged upload): element {i} is {:#x}, expected {:#x}",
            got[i], want[i]
        )));
    }
    dev.synchronize()
}

/// A kernel's write on stream A is seen by a kernel on B and a download on C.
pub fn kernel_write_then_read_on_other_streams(dev: &Device) -> Result<()> {
    let (a, b, c) = (
        dev.create_stream()?,
        dev.create_stream()?,
        dev.create_stream()?,
    );
    let n = 4096;
    let x = dev.alloc::<u32>(n)?;
    let y = dev.alloc::<u32>(n)?;
    let sink = dev.alloc::<u32>(1)?;
    for i in 0..32u32 {
        busy(dev, &sink, 10_000, a)?;
        fill(dev, &x, i * 3, a)?;
        add(dev, &x, &y, 7, b)?;
        let got = dev.download(&y, c)?.wait()?;
        expect_all(&got, i * 3 + 7, "kernel write then read")?;
    }
    dev.synchronize()
}

/// A device-to-device copy on one stream is seen by a kernel on another.
pub fn copy_then_read_on_other_stream(dev: &Device) -> Result<()> {
    let (a, b) = (dev.create_stream()?, dev.create_stream()?);
    let n = 8192;
    let src = dev.alloc::<u32>(n)?;
    let mid = dev.alloc::<u32>(n)?;
    let out = dev.alloc::<u32>(n)?;
    let sink = dev.alloc::<u32>(1)?;
    for i in 0..32u32 {
        fill(dev, &src, i, b)?;
        busy(dev, &sink, 10_000, a)?;
        dev.copy(&mid, &src, a)?;
        add(dev, &mid, &out, 2, b)?;
        let got = dev.download(&out, b)?.wait()?;
        expect_all(&got, i + 2, "copy then read")?;
    }
    dev.synchronize()
}

/// A write on stream A waits for an earlier read on stream B (the reader sees the old value).
pub fn write_after_read(dev: &Device) -> Result<()> {
    let (a, b) = (dev.create_stream()?, dev.create_stream()?);
    let n = 4096;
    let x = dev.alloc::<u32>(n)?;
    let y = dev.alloc::<u32>(n)?;
    let sink = dev.alloc::<u32>(1)?;
    for i in 0..32u32 {
        dev.upload(&x, &vec![i; n], a)?;
        busy(dev, &sink, 50_000, b)?;
        add(dev, &x, &y, 0, b)?; // reads i, slowly
        dev.upload(&x, &vec![i + 1000; n], a)?; // must not overtake the read
        fill(dev, &x, i + 2000, a)?; // nor must a kernel write
        let got = dev.download(&y, b)?.wait()?;
        expect_all(&got, i, "write after read")?;
    }
    dev.synchronize()
}

/// Events: a recorded event completes once earlier work has, and host waits see results.
pub fn events(dev: &Device) -> Result<()> {
    let s = dev.create_stream()?;
    let n = 1024;
    let x = dev.alloc::<u32>(n)?;
    let sink = dev.alloc::<u32>(1)?;
    let mut pinned = dev.alloc_pinned::<u32>(n)?;
    busy(dev, &sink, 2_000_000, s)?;
    fill(dev, &x, 41, s)?;
    dev.download_into(&pinned, &x, s)?;
    let ev = dev.record(s)?;
    ev.wait()?;
    if !ev.is_done()? {
        return Err(Error::Capture("event not done after wait".into()));
    }
    expect_all(pinned.host()?, 41, "event then pinned read")?;
    pinned.host_mut()?.fill(9);
    dev.upload_pinned(&x, 0, &pinned, 0..n, s)?;
    let got = dev.download(&x, s)?.wait()?;
    expect_all(&got, 9, "pinned upload")?;
    dev.synchronize()
}

/// A graph replays with a table it reads updated in place (by ordered uploads) between
/// replays, and sees each new value.
pub fn graph_replay_reads_updated_table(dev: &Device) -> Result<()> {
    let (copy, s) = (dev.create_stream()?, dev.create_stream()?);
    let n = 24 * 1024;
    let table = dev.alloc::<u32>(n)?;
    let out = dev.alloc::<u32>(n)?;
    let sink = dev.alloc::<u32>(1)?;
    let mut graph = dev.capture(s, |d| {
        busy(d, &sink, 5_000, s)?;
        add(d, &table, &out, 1, s)
    })?;
    if graph.buffer_count() != 3 {
        return Err(Error::Capture(format!(
            "graph recorded {} buffers, expected 3",
            graph.buffer_count()
        )));
    }
    for i in 0..64u32 {
        dev.upload(&table, &vec![i * 5; n], copy)?;
        dev.replay(&mut graph, s)?;
        let got = dev.download(&out, copy)?.wait()?;
        expect_all(&got, i * 5 + 1, "graph replay after table update")?;
    }
    dev.synchronize()
}

/// Capture refuses host synchronisation, uploads, downloads, allocation and nesting; a
/// refused capture leaves the device usable.
pub fn capture_refuses_forbidden_calls(dev: &Device) -> Result<()> {
    let s = dev.create_stream()?;
    let x = dev.alloc::<u32>(16)?;
    type Forbidden = fn(&Device, &crate::DeviceBuffer<u32>, crate::Stream) -> Result<()>;
    let attempts: [(&str, Forbidden); 6] = [
        ("upload", |d, x, s| d.upload(x, &[1u32; 16], s)),
        ("download", |d, x, s| d.download(x, s).map(|_| ())),
        ("synchronize", |d, _, _| d.synchronize()),
        ("alloc", |d, _, _| d.alloc::<u32>(4).map(|_| ())),
        ("event record", |d, _, s| d.record(s).map(|_| ())),
        ("nested capture", |d, _, s| {
            d.capture(s, |_| Ok(())).map(|_| ())
        }),
    ];
    for (name, f) in attempts {
        let r = dev.capture(s, |d| {
            fill(d, &x, 1, s)?;
            f(d, &x, s)
        });
        match r {
            Err(Error::CaptureForbidden { .. }) | Err(Error::Capture(_)) => {}
            Err(e) => {
                return Err(Error::Capture(format!(
                    "{name} during capture gave another error: {e}"
                )));
            }
            Ok(_) => {
                return Err(Error::Capture(format!(
                    "{name} during capture was accepted"
                )));
            }
        }
    }
    fill(dev, &x, 5, s)?;
    let got = dev.download(&x, s)?.wait()?;
    expect_all(&got, 5, "device usable after refused captures")?;
    dev.synchronize()
}

/// Many streams, many launches: a chain of buffers where each stream reads the previous
/// stream's output, repeated, must give exact counts.
pub fn many_streams_stress(dev: &Device) -> Result<()> {
    let streams: Vec<_> = (0..8).map(|_| dev.create_stream()).collect::<Result<_>>()?;
    let n = 2048;
    let bufs: Vec<_> = (0..streams.len() + 1)
        .map(|_| dev.alloc::<u32>(n))
        .collect::<Result<_>>()?;
    let rounds = 100u32;
    for r in 0..rounds {
        fill(dev, &bufs[0], r, streams[0])?;
        for (i, s) in streams.iter().enumerate() {
            add(dev, &bufs[i], &bufs[i + 1], 1, *s)?;
        }
    }
    let got = dev.download(&bufs[streams.len()], streams[3])?.wait()?;
    expect_all(&got, rounds - 1 + streams.len() as u32, "stress chain")?;
    dev.synchronize()
}

/// Asking for more memory than the device has is an error, not a crash, and the device
/// keeps working; memory accounting follows allocations.
pub fn out_of_memory_is_an_error(dev: &Device) -> Result<()> {
    let before = dev.memory()?;
    let huge = before.total.saturating_mul(2).max(1 << 40);
    match dev.alloc::<u8>(huge) {
        Err(Error::OutOfMemory { .. }) => {}
        Err(e) => {
            return Err(Error::Capture(format!(
                "huge alloc gave another error: {e}"
            )));
        }
        Ok(_) => {
            return Err(Error::Capture(
                "allocating twice the device memory succeeded".into(),
            ));
        }
    }
    if dev.alloc::<u64>(usize::MAX / 4).is_ok() {
        return Err(Error::Capture("an overflowing allocation succeeded".into()));
    }
    let x = dev.alloc::<u32>(1 << 20)?;
    let during = dev.memory()?;
    if during.reserved < before.reserved + (4 << 20) {
        return Err(Error::Capture(
            "reserved memory did not grow with an allocation".into(),
        ));
    }
    let s = dev.main_stream();
    fill(dev, &x, 3, s)?;
    expect_all(&dev.download(&x, s)?.wait()?, 3, "after OOM")?;
    drop(x);
    dev.synchronize()?;
    let after = dev.memory()?;
    if after.reserved > before.reserved {
        return Err(Error::Capture(
            "reserved memory not returned after free".into(),
        ));
    }
    Ok(())
}

struct HostWords(Vec<u32>);

impl crate::HostMemory for HostWords {
    fn bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

/// Imported host memory (where the backend supports it) is readable by kernels and
/// refuses every write; a backend without it says so with `None`.
pub fn imported_host_memory_is_read_only(dev: &Device) -> Result<()> {
    let s = dev.main_stream();
    let words: std::sync::Arc<dyn crate::HostMemory> =
        std::sync::Arc::new(HostWords((0..1000u32).collect()));
    if dev.import_host::<u32>(words.clone(), 0, 1001).is_ok() {
        return Err(Error::Capture(
            "import past the end of host memory was accepted".into(),
        ));
    }
    let Some(table) = dev.import_host::<u32>(words, 4 * 10, 990)? else {
        return dev.synchronize();
    };
    let out = dev.alloc::<u32>(990)?;
    add(dev, &table, &out, 1, s)?;
    let got = dev.download(&out, s)?.wait()?;
    if got.iter().enumerate().any(|(i, &v)| v != i as u32 + 11) {
        return Err(Error::Capture(
            "kernel read of imported memory gave wrong values".into(),
        ));
    }
    if !matches!(fill(dev, &table, 0, s), Err(Error::ReadOnly { .. })) {
        return Err(Error::Capture(
            "a kernel write to imported memory was accepted".into(),
        ));
    }
    if !matches!(dev.upload(&table, &[1u32], s), Err(Error::ReadOnly { .. })) {
        return Err(Error::Capture(
            "an upload into imported memory was accepted".into(),
        ));
    }
    dev.synchronize()
}

/// Uploads from registered host memory ([`Device::register_host`]) land like staged ones,
/// mixed with staged pieces in one upload, ordered before a kernel on another stream that
/// was already queued behind a slow one; a backend without registration says `false`.
pub fn uploads_from_registered_host_memory(dev: &Device) -> Result<()> {
    let (copy, compute) = (dev.create_stream()?, dev.create_stream()?);
    let words = std::sync::Arc::new(HostWords((0..4096u32).map(|i| i * 3).collect()));
    if !dev.register_host(words.clone())? {
        return dev.synchronize();
    }
    if !dev.register_host(words.clone())? {
        return Err(Error::Capture(
            "registering the same memory again was refused".into(),
        ));
    }
    let before = dev.upload_counts();
    let dst = dev.alloc::<u32>(600)?;
    let out = dev.alloc::<u32>(600)?;
    let sink = dev.alloc::<u32>(1)?;
    fill(dev, &dst, 1, compute)?;
    // The compute stream is busy when the copy stream's upload is queued: the upload must
    // wait for the fill (write after write), and the add for the upload.
    busy(dev, &sink, 2_000_000, compute)?;
    let elsewhere: Vec<u32> = (0..50).map(|i| 100_000 + i).collect();
    let registered = &words.0;
    dev.upload_ranges(
        &dst,
        &[
            (0, &registered[10..110]),
            (200, &elsewhere[..]),
            (300, &registered[4000..4096]),
        ],
        copy,
    )?;
    add(dev, &dst, &out, 1, compute)?;
    let got = dev.download(&out, compute)?.wait()?;
    let want = |i: usize| -> u32 {
        match i {
            0..100 => (10 + i as u32) * 3 + 1,
            200..250 => 100_000 + (i as u32 - 200) + 1,
            300..396 => (4000 + i as u32 - 300) * 3 + 1,
            _ => 2,
        }
    };
    if let Some(i) = (0..600).find(|&i| got[i] != want(i)) {
        return Err(Error::Capture(format!(
            "upload from registered memory: element {i} is {} instead of {}",
            got[i],
            want(i)
        )));
    }
    let after = dev.upload_counts();
    let (direct, staged) = (after.direct - before.direct, after.staged - before.staged);
    if (direct, staged) != (4 * 196, 4 * 50) {
        return Err(Error::Capture(format!(
            "{direct} bytes uploaded directly and {staged} staged; expected 784 and 200"
        )));
    }
    dev.synchronize()
}

/// A kernel given a region of a buffer ([`crate::DeviceSlice`]) sees the region's start
/// and writes inside it only; a region reaching past its buffer is refused.
pub fn region_arguments_stay_in_their_region(dev: &Device) -> Result<()> {
    let s = dev.main_stream();
    let n = 1000;
    let buf = dev.alloc::<u32>(3 * n)?;
    dev.upload(&buf, &vec![1u32; 3 * n], s)?;
    let middle = buf.slice(n, n)?;
    dev.launch(
        KernelId::FillU32,
        &LaunchCfg::linear(n, BLOCK),
        &Args::new().write_slice(middle).u32(n as u32).u32(7),
        s,
    )?;
    // Read back through a region too: element i of the middle third, plus 1.
    let out = dev.alloc::<u32>(n)?;
    dev.launch(
        KernelId::AddU32,
        &LaunchCfg::linear(n, BLOCK),
        &Args::new()
            .read_slice(middle)
            .write(&out)
            .u32(n as u32)
            .u32(1),
        s,
    )?;
    let got = dev.download(&buf, s)?.wait()?;
    expect_all(&got[..n], 1, "before a written region")?;
    expect_all(&got[n..2 * n], 7, "a written region")?;
    expect_all(&got[2 * n..], 1, "after a written region")?;
    expect_all(&dev.download(&out, s)?.wait()?, 8, "read through a region")?;
    if buf.slice(2 * n + 1, n).is_ok() || buf.slice(usize::MAX, 2).is_ok() {
        return Err(Error::Capture(
            "a region reaching past its buffer was accepted".into(),
        ));
    }
    dev.synchronize()
}

/// DESIGN.md's experiment through the Device API: a 96 KiB int32 table uploaded on a copy
/// stream, then a reader launched at once on another stream, `iterations` times, with a
/// large upload queued on a third stream before each table copy when `loaded`. Returns how
/// many readers saw a stale table (must be 0).
pub fn table_experiment(dev: &Device, iterations: u32, loaded: bool) -> Result<u32> {
    let (copy, reader, bulk) = (
        dev.create_stream()?,
        dev.create_stream()?,
        dev.create_stream()?,
    );
    let n = 96 * 1024 / 4;
    let table = dev.alloc::<i32>(n)?;
    let flags = dev.alloc::<u32>(iterations as usize)?;
    dev.upload(&flags, &vec![0u32; iterations as usize], reader)?;
    let big_len = if loaded { 1 << 20 } else { 0 };
    let big = dev.alloc::<u32>(big_len.max(1))?;
    let big_host = vec![7u32; big_len];
    for i in 0..iterations {
        if loaded {
            dev.upload(&big, &big_host, bulk)?;
        }
        dev.upload(&table, &vec![i as i32; n], copy)?;
        dev.launch(
            KernelId::CheckTable,
            &LaunchCfg::linear(n, BLOCK),
            &Args::new()
                .read(&table)
                .write(&flags)
                .u32(n as u32)
                .i32(i as i32)
                .u32(i),
            reader,
        )?;
    }
    let seen = dev.download(&flags, reader)?.wait()?;
    dev.synchronize()?;
    Ok(seen.iter().filter(|&&f| f != 0).count() as u32)
}

/// The experiment as a test: 0 stale readers of 2,000, idle and loaded.
pub fn table_experiment_through_device_api(dev: &Device) -> Result<()> {
    for loaded in [false, true] {
        let iterations = if loaded { 500 } else { 2000 };
        let stale = table_experiment(dev, iterations, loaded)?;
        if stale != 0 {
            return Err(Error::Capture(format!(
                "{stale} of {iterations} readers saw a stale table through the Device API (loaded: {loaded})"
            )));
        }
    }
    Ok(())
}

/// Generates one `#[test]` per conformance test for a backend. `$make` is an expression
/// of type `fn() -> Option<Device>`; `None` means the backend has no device here, and the
/// test prints one line saying so.
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!(@each $make;
            upload_then_read_on_other_stream,
            large_upload_lands_whole,
            ranged_upload_lands_in_place,
            kernel_write_then_read_on_other_streams,
            copy_then_read_on_other_stream,
            write_after_read,
            events,
            graph_replay_reads_updated_table,
            capture_refuses_forbidden_calls,
            many_streams_stress,
            out_of_memory_is_an_error,
            imported_host_memory_is_read_only,
            uploads_from_registered_host_memory,
            table_experiment_through_device_api,
            region_arguments_stay_in_their_region,
            int8_kv_cache,
            argmax_rows
        );
    };
    (@each $make:expr; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                let make: fn() -> Option<$crate::Device> = $make;
                match make() {
                    Some(dev) => {
                        if let Err(e) = $crate::conformance::$name(&dev) {
                            panic!("{}: {e}", stringify!($name));
                        }
                    }
                    None => eprintln!("{}: skipped, no device of this backend here", stringify!($name)),
                }
            }
        )*
    };
}
