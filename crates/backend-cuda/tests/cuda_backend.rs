//! CUDA-specific behaviour beyond the conformance suite: the no-driver path, the kernel
//! cache, argument checking, driver errors naming their call, graphs with copies.
//! GPU tests skip (one line each) when there is no driver or device.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use strata_backend_cuda::{CudaBackend, CudaOptions, ModuleOrigin};
use strata_core::{Args, Backend, Device, Error, KernelId, LaunchCfg};

/// GPU tests in this file run one at a time even without `--test-threads=1`.
static GPU: Mutex<()> = Mutex::new(());

fn gpu_lock() -> std::sync::MutexGuard<'static, ()> {
    GPU.lock().unwrap_or_else(|e| e.into_inner())
}

/// Device 0, or `None` (after printing why) when this machine has no usable driver/GPU.
fn gpu(test: &str) -> Option<Device> {
    match strata_backend_cuda::device(0) {
        Ok(d) => Some(d),
        Err(e @ (Error::NoDriver { .. } | Error::NoSuchDevice { .. })) => {
            eprintln!("{test}: skipped, no CUDA device here ({e})");
            None
        }
        Err(e) => panic!("a CUDA device is present but could not be opened: {e}"),
    }
}

/// Whether a libcuda is visible to the dynamic loader, judged without the backend:
/// the folders of LD_LIBRARY_PATH, the usual system folders and ldconfig's cache.
fn libcuda_visible() -> bool {
    let mut dirs: Vec<PathBuf> = std::env::var("LD_LIBRARY_PATH")
        .unwrap_or_default()
        .split(':')
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .collect();
    for d in [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/lib/x86_64-linux-gnu",
        "/usr/local/nvidia/lib64",
        "/usr/local/cuda/lib64/stubs",
    ] {
        dirs.push(PathBuf::from(d));
    }
    let in_dir = |d: &Path| {
        std::fs::read_dir(d).is_ok_and(|rd| {
            rd.filter_map(|e| e.ok()).any(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|n| n.starts_with("libcuda.so"))
            })
        })
    };
    if dirs.iter().any(|d| in_dir(d)) {
        return true;
    }
    ["/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"]
        .iter()
        .filter_map(|c| std::process::Command::new(c).arg("-p").output().ok())
        .any(|o| String::from_utf8_lossy(&o.stdout).contains("libcuda.so"))
}

#[test]
fn without_a_driver_devices_is_no_driver_and_nothing_panics() {
    let listed = std::panic::catch_unwind(strata_backend_cuda::devices);
    let opened = std::panic::catch_unwind(|| strata_backend_cuda::device(0).map(|_| ()));
    let (Ok(listed), Ok(opened)) = (listed, opened) else {
        panic!("devices() or device(0) panicked");
    };
    if libcuda_visible() {
        eprintln!(
            "without_a_driver_devices_is_no_driver_and_nothing_panics: a libcuda is installed \
             here, so only the no-panic half ran (devices: {:?})",
            listed.as_ref().map(|l| l.len())
        );
        return;
    }
    match listed {
        Err(Error::NoDriver { backend, reason }) => {
            assert_eq!(backend, "cuda");
            assert!(reason.contains("libcuda"), "{reason}");
        }
        other => panic!("expected NoDriver, got {other:?}"),
    }
    assert!(matches!(opened, Err(Error::NoDriver { .. })), "{opened:?}");
    assert!(matches!(
        strata_backend_cuda::driver_version(),
        Err(Error::NoDriver { .. })
    ));
}

#[test]
fn devices_agree_with_the_opened_device() {
    let _g = gpu_lock();
    let Some(dev) = gpu("devices_agree_with_the_opened_device") else {
        return;
    };
    let list = strata_backend_cuda::devices().unwrap();
    assert!(!list.is_empty());
    let info = dev.info();
    assert_eq!(info, &list[0]);
    assert!(info.arch.starts_with("sm_"), "{}", info.arch);
    let mem = dev.memory().unwrap();
    assert!(mem.total == info.total_memory && mem.free <= mem.total && mem.free > 0);
    eprintln!(
        "device 0: {} [{}], {} MiB, {} MiB free",
        info.name,
        info.arch,
        mem.total >> 20,
        mem.free >> 20
    );
}

/// (module, text) of every kernels-cuda/*.cu, read from the repository.
fn cuda_sources() -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels-cuda");
    std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .map(|p| {
            let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
            (stem, std::fs::read_to_string(&p).unwrap())
        })
        .collect()
}

/// The kernels `src` declares: `extern "C" __global__ void`, then any upper-case macros
/// (cluster dimensions) and `__launch_bounds__(...)`, then `NAME(`; `None` for a
/// declaration where no name follows.
fn declared_kernels(src: &str) -> Vec<Option<&str>> {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    src.split("extern \"C\" __global__ void")
        .skip(1)
        .map(|decl| {
            let mut rest = decl.trim_start();
            loop {
                if let Some(bounds) = rest.strip_prefix("__launch_bounds__(") {
                    rest = bounds.split_once(')')?.1.trim_start();
                    continue;
                }
                let end = rest.find(|c: char| !is_ident(c)).unwrap_or(rest.len());
                let word = &rest[..end];
                rest = rest[end..].trim_start();
                if rest.starts_with('(') {
                    return Some(word).filter(|w| !w.is_empty());
                }
                if word.is_empty() || word.chars().any(|c| c.is_ascii_lowercase()) {
                    return None;
                }
            }
        })
        .collect()
}

fn defines_kernel(src: &str, name: &str) -> bool {
    declared_kernels(src).contains(&Some(name))
}

fn temp_cache(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("strata-cuda-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn second_start_loads_kernels_from_the_cache_and_a_corrupt_image_is_rebuilt() {
    let _g = gpu_lock();
    if gpu("second_start_loads_kernels_from_the_cache_and_a_corrupt_image_is_rebuilt").is_none() {
        return;
    }
    let dir = temp_cache("cache");
    let opts = CudaOptions {
        cache_dir: Some(dir.clone()),
        ..CudaOptions::default()
    };
    let first = CudaBackend::new(0, &opts).unwrap();
    let arch = first.info().arch;
    let origins: Vec<_> = first.module_origins().to_vec();
    drop(first);
    // One image per kernels-cuda/ module that defines a listed kernel.
    let mut expected: Vec<String> = cuda_sources()
        .into_iter()
        .filter(|(m, _)| strata_core::KERNEL_MODULES.contains(&m.as_str()))
        .map(|(m, _)| m)
        .collect();
    expected.sort();
    let mut got: Vec<String> = origins.iter().map(|(m, _)| m.to_string()).collect();
    got.sort();
    assert_eq!(got, expected);
    for (m, o) in &origins {
        match o {
            // An NVRTC that knows the device builds machine code for it.
            ModuleOrigin::Nvrtc { target } => {
                assert!(
                    target == &arch || target.starts_with("compute_"),
                    "{m}: {target}"
                )
            }
            ModuleOrigin::Cache(p) => panic!("{m} came from a fresh cache dir: {}", p.display()),
        }
    }
    let second = CudaBackend::new(0, &opts).unwrap();
    for (m, o) in second.module_origins() {
        match o {
            ModuleOrigin::Cache(p) => {
                assert!(p.starts_with(dir.join(&arch)), "{}", p.display());
                assert!(p.exists());
            }
            other => panic!("{m} was not taken from the cache: {other:?}"),
        }
    }
    // The cached kernels work.
    let dev = Device::new(Box::new(second)).unwrap();
    let s = dev.main_stream();
    let x = dev.alloc::<u32>(1000).unwrap();
    dev.launch(
        KernelId::FillU32,
        &LaunchCfg::linear(1000, 128),
        &Args::new().write(&x).u32(1000).u32(77),
        s,
    )
    .unwrap();
    assert!(
        dev.download(&x, s)
            .unwrap()
            .wait()
            .unwrap()
            .iter()
            .all(|&v| v == 77)
    );
    drop(dev);

    // A corrupt image (the smallest, so only a small module is rebuilt: a cold compile of
    // every module takes minutes) is replaced by a fresh compile; the others still load.
    let third = CudaBackend::new(0, &opts).unwrap();
    let cached: Vec<(String, PathBuf)> = third
        .module_origins()
        .iter()
        .filter_map(|(m, o)| match o {
            ModuleOrigin::Cache(p) => Some((m.to_string(), p.clone())),
            _ => None,
        })
        .collect();
    drop(third);
    let (victim, path) = cached
        .iter()
        .min_by_key(|(_, p)| std::fs::metadata(p).map(|m| m.len()).unwrap_or(u64::MAX))
        .cloned()
        .expect("cached images");
    std::fs::write(&path, b"not a cubin").unwrap();
    let fourth = CudaBackend::new(0, &opts).unwrap();
    for (m, o) in fourth.module_origins() {
        match o {
            ModuleOrigin::Nvrtc { .. } => assert_eq!(*m, victim, "{m} was rebuilt"),
            ModuleOrigin::Cache(_) => assert_ne!(*m, victim, "the corrupt {m} was loaded"),
        }
    }
    drop(fourth);
    assert_ne!(
        std::fs::read(&path).unwrap(),
        b"not a cubin",
        "the image was not replaced"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn wrong_arguments_are_a_bad_launch() {
    let _g = gpu_lock();
    let Some(dev) = gpu("wrong_arguments_are_a_bad_launch") else {
        return;
    };
    let s = dev.main_stream();
    let x = dev.alloc::<u32>(64).unwrap();
    let cfg = LaunchCfg::linear(64, 64);
    // fill_u32 takes (unsigned int*, unsigned int, unsigned int).
    let missing = dev.launch(KernelId::FillU32, &cfg, &Args::new().write(&x).u32(64), s);
    assert!(
        matches!(
            missing,
            Err(Error::BadLaunch {
                kernel: "fill_u32",
                ..
            })
        ),
        "{missing:?}"
    );
    let wrong_size = dev.launch(
        KernelId::FillU32,
        &cfg,
        &Args::new().write(&x).u64(64).u32(1),
        s,
    );
    assert!(
        matches!(wrong_size, Err(Error::BadLaunch { .. })),
        "{wrong_size:?}"
    );
    // The device is unharmed.
    dev.launch(
        KernelId::FillU32,
        &cfg,
        &Args::new().write(&x).u32(64).u32(5),
        s,
    )
    .unwrap();
    assert!(
        dev.download(&x, s)
            .unwrap()
            .wait()
            .unwrap()
            .iter()
            .all(|&v| v == 5)
    );
}

#[test]
fn a_refused_launch_names_the_driver_call() {
    let _g = gpu_lock();
    let Some(dev) = gpu("a_refused_launch_names_the_driver_call") else {
        return;
    };
    let s = dev.main_stream();
    let x = dev.alloc::<u32>(64).unwrap();
    let too_big = LaunchCfg {
        grid: [1, 1, 1],
        block: [4096, 1, 1],
        shared_bytes: 0,
    };
    let r = dev.launch(
        KernelId::FillU32,
        &too_big,
        &Args::new().write(&x).u32(64).u32(1),
        s,
    );
    match r {
        Err(Error::Driver { backend, call, .. }) => {
            assert_eq!((backend, call), ("cuda", "cuLaunchKernel"))
        }
        other => panic!("expected a driver error from cuLaunchKernel, got {other:?}"),
    }
    dev.launch(
        KernelId::FillU32,
        &LaunchCfg::linear(64, 64),
        &Args::new().write(&x).u32(64).u32(8),
        s,
    )
    .unwrap();
    assert!(
        dev.download(&x, s)
            .unwrap()
            .wait()
            .unwrap()
            .iter()
            .all(|&v| v == 8)
    );
}

#[test]
fn graphs_replay_device_copies_and_offsets() {
    let _g = gpu_lock();
    let Some(dev) = gpu("graphs_replay_device_copies_and_offsets") else {
        return;
    };
    let (up, s) = (dev.create_stream().unwrap(), dev.create_stream().unwrap());
    let n = 4096;
    let src = dev.alloc::<u32>(n).unwrap();
    let mid = dev.alloc::<u32>(n).unwrap();
    let out = dev.alloc::<u32>(n).unwrap();
    let mut graph = dev
        .capture(s, |d| {
            d.copy_range(&mid, 0, &src, 0, n, s)?;
            // Second half of `mid` into the second half of `out`, +3, through offsets.
            d.launch(
                KernelId::AddU32,
                &LaunchCfg::linear(n / 2, 256),
                &Args::new()
                    .read_at(&mid, n / 2)
                    .write_at(&out, n / 2)
                    .u32((n / 2) as u32)
                    .u32(3),
                s,
            )
        })
        .unwrap();
    for i in 0..8u32 {
        dev.upload(&out, &vec![0; n], up).unwrap();
        dev.upload(&src, &vec![i * 10; n], up).unwrap();
        dev.replay(&mut graph, s).unwrap();
        let got = dev.download(&out, up).unwrap().wait().unwrap();
        assert!(
            got[..n / 2].iter().all(|&v| v == 0),
            "replay {i}: first half"
        );
        assert!(
            got[n / 2..].iter().all(|&v| v == i * 10 + 3),
            "replay {i}: second half"
        );
    }
    dev.synchronize().unwrap();
}

/// With per-kernel timing on, a graph's profile is the last replay of the graph replayed
/// last, not of the latest capture: bench's verify-window profile and its decode-step
/// profile come from different graphs, captured in either order.
#[test]
fn kernel_times_follow_the_graph_replayed_last() {
    let _g = gpu_lock();
    let opts = CudaOptions {
        kernel_timing: true,
        ..CudaOptions::default()
    };
    let dev = match strata_backend_cuda::device_with(0, &opts) {
        Ok(d) => d,
        Err(e @ (Error::NoDriver { .. } | Error::NoSuchDevice { .. })) => {
            eprintln!("kernel_times_follow_the_graph_replayed_last: skipped ({e})");
            return;
        }
        Err(e) => panic!("a CUDA device is present but could not be opened: {e}"),
    };
    let s = dev.main_stream();
    let x = dev.alloc::<u32>(64).unwrap();
    let y = dev.alloc::<u32>(64).unwrap();
    let fill = |d: &Device, v: u32| {
        let args = Args::new().write(&x).u32(64).u32(v);
        d.launch(KernelId::FillU32, &LaunchCfg::linear(64, 64), &args, s)
    };
    let add = |d: &Device| {
        let args = Args::new().read(&x).write(&y).u32(64).u32(1);
        d.launch(KernelId::AddU32, &LaunchCfg::linear(64, 64), &args, s)
    };
    // One fill; then three adds (y = x + 1) and a fill, captured after it.
    let mut one = dev.capture(s, |d| fill(d, 1)).unwrap();
    let mut four = dev
        .capture(s, |d| {
            add(d)?;
            add(d)?;
            add(d)?;
            fill(d, 2)
        })
        .unwrap();
    let launches = |dev: &Device, kernel: KernelId| {
        let times = dev.kernel_times().unwrap();
        times
            .iter()
            .find(|t| t.kernel == kernel)
            .map_or(0, |t| t.launches)
    };
    for round in 0..2 {
        dev.replay(&mut one, s).unwrap();
        dev.synchronize().unwrap();
        assert_eq!(launches(&dev, KernelId::FillU32), 1, "round {round}: one");
        assert_eq!(launches(&dev, KernelId::AddU32), 0, "round {round}: one");
        dev.replay(&mut four, s).unwrap();
        dev.synchronize().unwrap();
        assert_eq!(launches(&dev, KernelId::AddU32), 3, "round {round}: four");
        assert_eq!(launches(&dev, KernelId::FillU32), 1, "round {round}: four");
    }
    for (name, buf) in [("x", &x), ("y", &y)] {
        let got = dev.download(buf, s).unwrap().wait().unwrap();
        assert!(got.iter().all(|&v| v == 2), "{name}: {:?}", &got[..4]);
    }
}

#[test]
fn the_unordered_upload_lands_once_the_device_is_synchronised() {
    // The founding bug's verb works as a copy; only its ordering is missing.
    let _g = gpu_lock();
    let Some(dev) = gpu("the_unordered_upload_lands_once_the_device_is_synchronised") else {
        return;
    };
    let t = dev.alloc::<i32>(24 * 1024).unwrap();
    dev.upload_unordered(&t, &vec![-9; 24 * 1024]).unwrap();
    dev.synchronize().unwrap();
    let got = dev.download(&t, dev.main_stream()).unwrap().wait().unwrap();
    assert!(got.iter().all(|&v| v == -9));
}

#[test]
fn supports_exactly_the_kernels_kernels_cuda_defines() {
    let _g = gpu_lock();
    if gpu("supports_exactly_the_kernels_kernels_cuda_defines").is_none() {
        return;
    }
    // Every optional kernel in use: those left out by default (launch_options.rs) are
    // defined too, and a default device reports them unsupported.
    let dev = strata_backend_cuda::device_with_every_kernel(0).unwrap();
    // The expectation, read from the sources themselves.
    let sources = cuda_sources();
    let defines = |id: KernelId| {
        sources
            .iter()
            .any(|(m, src)| m == id.module() && defines_kernel(src, id.name()))
    };
    for id in KernelId::ALL {
        // A kernel the backend runs as another (attention_rows as attention) is there
        // when that one is.
        let defined = defines(id) || strata_backend_cuda::runs_as(id).is_some_and(defines);
        assert_eq!(dev.supports(id), defined, "{}", id.name());
        if !defined {
            let x = dev.alloc::<u32>(1).unwrap();
            let r = dev.launch(
                id,
                &LaunchCfg::linear(1, 1),
                &Args::new().write(&x),
                dev.main_stream(),
            );
            assert!(
                matches!(r, Err(Error::Unsupported { .. })),
                "{}: {r:?}",
                id.name()
            );
        }
    }
}

#[test]
fn every_kernel_declaration_is_read() {
    // Needs no GPU: supports_exactly_the_kernels_kernels_cuda_defines finds each
    // declaration's name, launch bounds and cluster macros between `void` and the name.
    let sources = cuda_sources();
    let names: Vec<Option<&str>> = sources
        .iter()
        .flat_map(|(_, s)| declared_kernels(s))
        .collect();
    assert!(names.len() > 40, "{} declarations", names.len());
    assert!(names.iter().all(Option::is_some), "{names:?}");
    for name in [
        "mul_mat",
        "attention",
        "attention_long_q8",
        "mul_mat_experts_cached",
    ] {
        assert!(names.contains(&Some(name)), "{name}");
    }
    assert_eq!(
        declared_kernels("extern \"C\" __global__ void X __launch_bounds__(256, 2)\n  k_1(int)"),
        [Some("k_1")]
    );
}
