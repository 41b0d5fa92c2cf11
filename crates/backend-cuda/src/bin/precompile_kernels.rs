//! Compiles every kernels-cuda/ module with NVRTC into a kernel cache without a GPU, so the
//! first start on the device loads images instead of compiling (model.cu alone takes over
//! a minute). Honours `STRATA_NVRTC_DEFINES` (part of each image's cache key).
//!
//!     precompile_kernels [--cc 90] [--cache DIR]   (default: the backend's cache dir)
//!
//! then run strata with `STRATA_CACHE_DIR` set to DIR's parent (the cache is DIR/sm_XY/...;
//! `STRATA_CACHE_DIR=X` means DIR = X/kernels).

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut cc = (9, 0);
    let mut cache: Option<PathBuf> = strata_backend_cuda::default_cache_dir();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let value = args.next();
        match (a.as_str(), value) {
            ("--cc", Some(v)) => match v.parse::<u32>() {
                Ok(n) if n >= 10 => cc = (n / 10, n % 10),
                _ => {
                    eprintln!("--cc takes a compute capability such as 90, not {v:?}");
                    return ExitCode::from(2);
                }
            },
            ("--cache", Some(v)) => cache = Some(PathBuf::from(v)),
            (other, _) => {
                eprintln!("usage: precompile_kernels [--cc 90] [--cache DIR] (unknown {other:?})");
                return ExitCode::from(2);
            }
        }
    }
    let Some(cache) = cache else {
        eprintln!("no cache directory: pass --cache DIR (or set STRATA_CACHE_DIR or HOME)");
        return ExitCode::from(2);
    };
    match strata_backend_cuda::precompile(cc, &cache) {
        Ok(done) => {
            for (module, path, compiled) in done {
                let how = if compiled { "compiled" } else { "cached" };
                println!("{module}: {how} {}", path.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("precompile_kernels: {e}");
            ExitCode::FAILURE
        }
    }
}
