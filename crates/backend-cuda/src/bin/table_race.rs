//! DESIGN.md's founding experiment on a real GPU.
//!
//! A 96 KiB int32 table is rewritten with a new value before each launch of a reader
//! kernel (`check_table`) on a CU_STREAM_NON_BLOCKING stream; a reader that sees any
//! entry other than the value just written flags its slot. Arms:
//!
//! - A: the raw hazard: the synchronous `cuMemcpyHtoD_v2` from a pageable host vector,
//!   reader launched at once, idle GPU (2,000 launches, twice).
//! - B: as A, with a 256 MiB pinned upload queued by `cuMemcpyHtoDAsync_v2` on a third
//!   non-blocking stream just before each table copy (500 launches, twice).
//! - A0: control: as A, but the legacy stream is synchronised after each copy.
//! - C: the same through strata's `Device` API (ordered upload on a copy stream, launch on
//!   the reader stream), idle and under the same 256 MiB load: must be 0.
//!
//! Arms A, A0 and B use the backend's raw verbs directly (no core, so no ordering);
//! that is only ever done here and in tests that prove the hazard exists.

use std::time::Instant;

use cudarc::driver::sys;
use strata_backend_cuda::{CudaBackend, CudaOptions};
use strata_core::{
    Access, Args, Backend, Device, Error, KernelArg, KernelId, LaunchCfg, RawBuffer, RawPinned,
    RawStream, Result,
};

const TABLE_LEN: usize = 96 * 1024 / 4;
const IDLE_LAUNCHES: u32 = 2000;
const LOADED_LAUNCHES: u32 = 500;
const BIG_BYTES: usize = 256 << 20;
const BLOCK: u32 = 256;

fn site() -> strata_core::Site {
    std::panic::Location::caller()
}

/// The load of arm B: a 256 MiB pinned host buffer and its device destination.
struct Load {
    dev: RawBuffer,
    host: RawPinned,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum RawArm {
    /// Copy, then launch at once.
    Plain,
    /// Copy, synchronise the legacy stream, then launch.
    LegacySync,
}

/// One raw run: returns how many of `launches` readers saw a stale table.
/// Which readers saw a stale table.
struct Stale {
    count: u32,
    /// Stale readers with an even index (launch number).
    even: u32,
    /// The first few stale launch numbers.
    first: Vec<u32>,
}

impl Stale {
    fn from_flags(flags: &[u32]) -> Self {
        let idx: Vec<u32> = (0..flags.len() as u32)
            .filter(|&i| flags[i as usize] != 0)
            .collect();
        Stale {
            count: idx.len() as u32,
            even: idx.iter().filter(|&&i| i % 2 == 0).count() as u32,
            first: idx.iter().copied().take(8).collect(),
        }
    }
}

fn raw_run(be: &CudaBackend, launches: u32, load: Option<&Load>, arm: RawArm) -> Result<Stale> {
    let reader = be.create_stream()?;
    let bulk = be.create_stream()?;
    let table = be.alloc(TABLE_LEN * 4)?;
    let flags = be.alloc(launches as usize * 4)?;
    let result = raw_loop(be, reader, bulk, table, flags, launches, load, arm);
    let _ = be.synchronize();
    // SAFETY: the device is idle after the synchronisation.
    unsafe {
        be.free(table);
        be.free(flags);
    }
    result
}

#[allow(clippy::too_many_arguments)]
fn raw_loop(
    be: &CudaBackend,
    reader: RawStream,
    bulk: RawStream,
    table: RawBuffer,
    flags: RawBuffer,
    launches: u32,
    load: Option<&Load>,
    arm: RawArm,
) -> Result<Stale> {
    // Initial state, fully landed before the experiment starts.
    be.copy_h2d_unordered(flags, 0, &vec![0u8; launches as usize * 4], site())?;
    be.copy_h2d_unordered(
        table,
        0,
        bytemuck::cast_slice(&vec![-1i32; TABLE_LEN]),
        site(),
    )?;
    be.synchronize()?;
    let cfg = LaunchCfg::linear(TABLE_LEN, BLOCK);
    for i in 0..launches {
        if let Some(l) = load {
            // SAFETY: the pinned source and the device buffer outlive the run (it ends
            // with a synchronisation); the range is the whole of both.
            unsafe { be.copy_h2d(bulk, l.dev, 0, &l.host, 0, l.host.len, site())? };
        }
        let host = vec![i as i32; TABLE_LEN];
        // cuMemcpyHtoD_v2 from this pageable vector.
        be.copy_h2d_unordered(table, 0, bytemuck::cast_slice(&host), site())?;
        if arm == RawArm::LegacySync {
            be.bind()?;
            // SAFETY: the null stream is the legacy default stream of the bound context.
            let r = unsafe { sys::cuStreamSynchronize(std::ptr::null_mut()) };
            if r != sys::CUresult::CUDA_SUCCESS {
                return Err(Error::Driver {
                    backend: "cuda",
                    call: "cuStreamSynchronize",
                    message: format!("{r:?}"),
                });
            }
        }
        be.launch(
            reader,
            KernelId::CheckTable,
            &cfg,
            &[
                KernelArg::Buffer {
                    buf: table,
                    offset: 0,
                    bytes: TABLE_LEN * 4,
                    access: Access::Read,
                },
                KernelArg::Buffer {
                    buf: flags,
                    offset: 0,
                    bytes: launches as usize * 4,
                    access: Access::Write,
                },
                KernelArg::U32(TABLE_LEN as u32),
                KernelArg::I32(i as i32),
                KernelArg::U32(i),
            ],
            site(),
        )?;
    }
    be.synchronize()?;
    let out = be.alloc_pinned(launches as usize * 4)?;
    // SAFETY: `out` is large enough and read only after the synchronisation below.
    let copied = unsafe { be.copy_d2h(reader, &out, 0, flags, 0, out.len, site()) }
        .and_then(|()| be.synchronize());
    let stale = copied.map(|()| {
        // SAFETY: the copy completed; `out` holds `launches` u32 values.
        let seen = unsafe { std::slice::from_raw_parts(out.ptr.cast::<u32>(), launches as usize) };
        Stale::from_flags(seen)
    });
    // SAFETY: idle after the synchronisation.
    unsafe { be.free_pinned(out) };
    stale
}

/// Arm C under load: the same loop through the Device API, with the 256 MiB pinned
/// upload queued on a third stream before each table upload.
fn device_run_loaded(dev: &Device, launches: u32) -> Result<Stale> {
    let (copy, reader, bulk) = (
        dev.create_stream()?,
        dev.create_stream()?,
        dev.create_stream()?,
    );
    let table = dev.alloc::<i32>(TABLE_LEN)?;
    let flags = dev.alloc::<u32>(launches as usize)?;
    dev.upload(&flags, &vec![0u32; launches as usize], reader)?;
    let big = dev.alloc::<u8>(BIG_BYTES)?;
    let big_host = dev.alloc_pinned::<u8>(BIG_BYTES)?;
    for i in 0..launches {
        dev.upload_pinned(&big, 0, &big_host, 0..BIG_BYTES, bulk)?;
        dev.upload(&table, &vec![i as i32; TABLE_LEN], copy)?;
        dev.launch(
            KernelId::CheckTable,
            &LaunchCfg::linear(TABLE_LEN, BLOCK),
            &Args::new()
                .read(&table)
                .write(&flags)
                .u32(TABLE_LEN as u32)
                .i32(i as i32)
                .u32(i),
            reader,
        )?;
    }
    let seen = dev.download(&flags, reader)?.wait()?;
    dev.synchronize()?;
    Ok(Stale::from_flags(&seen))
}

struct Row {
    arm: &'static str,
    what: &'static str,
    run: u32,
    stale: Stale,
    launches: u32,
    ms: f64,
}

fn timed(f: impl FnOnce() -> Result<Stale>) -> Result<(Stale, f64)> {
    let t = Instant::now();
    let stale = f()?;
    Ok((stale, t.elapsed().as_secs_f64() * 1e3))
}

/// A count-only result (core's experiment reports no indices).
fn count_only(count: u32) -> Stale {
    Stale {
        count,
        even: 0,
        first: Vec::new(),
    }
}

fn run() -> Result<bool> {
    let list = strata_backend_cuda::devices()?;
    let Some(info) = list.first() else {
        println!("table_race: the CUDA driver loaded but found no device");
        return Ok(false);
    };
    let (dmaj, dmin) = strata_backend_cuda::driver_version()?;
    println!(
        "device 0: {} [{}], {:.1} GiB; driver CUDA {dmaj}.{dmin}; NVRTC {:?}",
        info.name,
        info.arch,
        info.total_memory as f64 / (1u64 << 30) as f64,
        strata_backend_cuda::nvrtc_version()
    );
    let be = CudaBackend::new(0, &CudaOptions::default())?;
    for (m, o) in be.module_origins() {
        println!("kernel module {m}: {o:?}");
    }
    let mut rows = Vec::new();

    // Warm up: first launch and first copies pay one-time costs.
    raw_run(&be, 16, None, RawArm::Plain)?;

    for run in 1..=2 {
        let (stale, ms) = timed(|| raw_run(&be, IDLE_LAUNCHES, None, RawArm::Plain))?;
        rows.push(Row {
            arm: "A",
            what: "raw pageable cuMemcpyHtoD, reader at once, idle GPU",
            run,
            stale,
            launches: IDLE_LAUNCHES,
            ms,
        });
    }
    let load = Load {
        dev: be.alloc(BIG_BYTES)?,
        host: be.alloc_pinned(BIG_BYTES)?,
    };
    let mut loaded = || -> Result<()> {
        for run in 1..=2 {
            let (stale, ms) = timed(|| raw_run(&be, LOADED_LAUNCHES, Some(&load), RawArm::Plain))?;
            rows.push(Row {
                arm: "B",
                what: "as A + 256 MiB pinned upload queued on a 3rd stream",
                run,
                stale,
                launches: LOADED_LAUNCHES,
                ms,
            });
        }
        for run in 1..=2 {
            let (stale, ms) =
                timed(|| raw_run(&be, LOADED_LAUNCHES, Some(&load), RawArm::LegacySync))?;
            rows.push(Row {
                arm: "A0",
                what: "control: as B + synchronize the legacy stream",
                run,
                stale,
                launches: LOADED_LAUNCHES,
                ms,
            });
        }
        Ok(())
    };
    let raw_result = loaded();
    let _ = be.synchronize();
    // SAFETY: idle after the synchronisation.
    unsafe {
        be.free(load.dev);
        be.free_pinned(load.host);
    }
    raw_result?;
    drop(be);

    let dev = strata_backend_cuda::device(0)?;
    for run in 1..=2 {
        let (stale, ms) = timed(|| {
            strata_core::conformance::table_experiment(&dev, IDLE_LAUNCHES, false).map(count_only)
        })?;
        rows.push(Row {
            arm: "C",
            what: "Device API upload + launch, idle GPU",
            run,
            stale,
            launches: IDLE_LAUNCHES,
            ms,
        });
    }
    for run in 1..=2 {
        let (stale, ms) = timed(|| device_run_loaded(&dev, LOADED_LAUNCHES))?;
        rows.push(Row {
            arm: "C",
            what: "Device API, same 256 MiB pinned load on a 3rd stream",
            run,
            stale,
            launches: LOADED_LAUNCHES,
            ms,
        });
    }
    let (stale, ms) = timed(|| {
        strata_core::conformance::table_experiment(&dev, LOADED_LAUNCHES, true).map(count_only)
    })?;
    rows.push(Row {
        arm: "C",
        what: "Device API, core's conformance load (4 MiB)",
        run: 1,
        stale,
        launches: LOADED_LAUNCHES,
        ms,
    });

    println!();
    println!(
        "{:<3} {:<54} {:>3} {:>16} {:>9}",
        "arm", "upload, then reader", "run", "stale readers", "ms"
    );
    for r in &rows {
        println!(
            "{:<3} {:<54} {:>3} {:>16} {:>9.1}",
            r.arm,
            r.what,
            r.run,
            format!("{} of {}", r.stale.count, r.launches),
            r.ms
        );
    }
    println!();
    for r in rows
        .iter()
        .filter(|r| r.stale.count > 0 && !r.stale.first.is_empty())
    {
        println!(
            "arm {} run {}: stale readers at even launch numbers: {} of {}; first stale: {:?}",
            r.arm, r.run, r.stale.even, r.stale.count, r.stale.first
        );
    }
    let device_api_clean = rows
        .iter()
        .filter(|r| r.arm == "C")
        .all(|r| r.stale.count == 0);
    println!();
    println!(
        "Device API: {}",
        if device_api_clean {
            "0 stale readers in every run"
        } else {
            "STALE READS THROUGH THE DEVICE API"
        }
    );
    Ok(device_api_clean)
}

fn main() {
    match run() {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e @ Error::NoDriver { .. }) => {
            println!("table_race: {e}");
            std::process::exit(2);
        }
        Err(e) => {
            eprintln!("table_race: {e}");
            std::process::exit(1);
        }
    }
}
