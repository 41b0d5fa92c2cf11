//! Embeds every kernel source of kernels-hip/ into the binary: `*.hip` files become
//! modules hiprtc compiles at start-up (named by file stem, as `KernelId::module()`
//! reports them), `*.h` files become headers those modules may `#include`.

use std::fmt::Write as _;
use std::path::Path;

fn main() {
    // Read at run time: a build script compiled for one checkout may run for another.
    let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    let dir = Path::new(&manifest).join("../../kernels-hip");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut files: Vec<_> = match std::fs::read_dir(&dir) {
        Ok(rd) => rd.filter_map(|e| e.ok()).map(|e| e.path()).collect(),
        Err(e) => panic!("cannot read the kernel sources in {}: {e}", dir.display()),
    };
    files.sort();
    let mut modules = String::new();
    let mut headers = String::new();
    for file in &files {
        let (Some(stem), Some(name), Some(ext)) = (
            file.file_stem().and_then(|s| s.to_str()),
            file.file_name().and_then(|s| s.to_str()),
            file.extension().and_then(|s| s.to_str()),
        ) else {
            continue;
        };
        println!("cargo:rerun-if-changed={}", file.display());
        let path = file.display().to_string();
        match ext {
            "hip" => {
                let _ = writeln!(modules, "    ({stem:?}, include_str!({path:?})),");
            }
            "h" => {
                let _ = writeln!(headers, "    ({name:?}, include_str!({path:?})),");
            }
            _ => {}
        }
    }
    let out = format!(
        "/// (module, source) of every kernels-hip/*.hip, in file order.\n\
         pub(crate) const KERNEL_SOURCES: &[(&str, &str)] = &[\n{modules}];\n\n\
         /// (file name, text) of every kernels-hip/*.h, offered to hiprtc as headers.\n\
         pub(crate) const KERNEL_HEADERS: &[(&str, &str)] = &[\n{headers}];\n"
    );
    let dest = Path::new(&std::env::var("OUT_DIR").unwrap_or_else(|_| ".".into()))
        .join("kernel_sources.rs");
    if let Err(e) = std::fs::write(&dest, out) {
        panic!("writing {}: {e}", dest.display());
    }
}
