//! Generates `KernelId` from kernels.txt, so call sites name kernels by enum, never by
//! string, and the CPU backend's exhaustive match fails to build when one is missing.

use std::fmt::Write as _;
use std::path::Path;

fn main() {
    // Read at run time: a build script compiled for one checkout may run for another (a
    // shared target dir), and a missing list must fail the build, not empty the enum.
    let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    let list = Path::new(&manifest).join("kernels.txt");
    println!("cargo:rerun-if-changed={}", list.display());
    let text = match std::fs::read_to_string(&list) {
        Ok(t) => t,
        Err(e) => panic!("cannot read {}: {e}", list.display()),
    };
    let mut kernels: Vec<(String, String)> = Vec::new(); // (kernel, module)
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut parts = line.split_whitespace();
        if let (Some(module), Some(name)) = (parts.next(), parts.next()) {
            kernels.push((name.to_string(), module.to_string()));
        }
    }
    let camel = |s: &str| -> String {
        s.split('_')
            .map(|w| {
                let mut c = w.chars();
                c.next()
                    .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                    .unwrap_or_default()
            })
            .collect()
    };
    let mut out = String::new();
    out.push_str("/// A kernel, by the name it has in kernels-cuda/ and kernels-hip/.\n");
    out.push_str("#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]\n");
    out.push_str("#[repr(u32)]\npub enum KernelId {\n");
    for (k, _) in &kernels {
        let _ = writeln!(out, "    {},", camel(k));
    }
    out.push_str("}\n\nimpl KernelId {\n");
    let _ = writeln!(out, "    pub const COUNT: usize = {};", kernels.len());
    out.push_str("    pub const ALL: [KernelId; Self::COUNT] = [\n");
    for (k, _) in &kernels {
        let _ = writeln!(out, "        KernelId::{},", camel(k));
    }
    out.push_str("    ];\n\n    /// The kernel's symbol name in the sources.\n");
    out.push_str("    pub const fn name(self) -> &'static str {\n        match self {\n");
    for (k, _) in &kernels {
        let _ = writeln!(out, "            KernelId::{} => \"{}\",", camel(k), k);
    }
    out.push_str(
        "        }\n    }\n\n    /// The source file (without extension) that defines it.\n",
    );
    out.push_str("    pub const fn module(self) -> &'static str {\n        match self {\n");
    for (k, m) in &kernels {
        let _ = writeln!(out, "            KernelId::{} => \"{}\",", camel(k), m);
    }
    out.push_str("        }\n    }\n\n    /// Index into per-kernel tables (0..COUNT).\n");
    out.push_str("    pub const fn index(self) -> usize {\n        self as usize\n    }\n}\n");
    let mut modules: Vec<&str> = Vec::new();
    for (_, m) in &kernels {
        if !modules.contains(&m.as_str()) {
            modules.push(m);
        }
    }
    out.push_str("\n/// Every kernel source module, in file order.\n");
    let _ = writeln!(
        out,
        "pub const KERNEL_MODULES: [&str; {}] = [",
        modules.len()
    );
    for m in &modules {
        let _ = writeln!(out, "    \"{m}\",");
    }
    out.push_str("];\n");
    let dest =
        Path::new(&std::env::var("OUT_DIR").unwrap_or_else(|_| ".".into())).join("kernel_ids.rs");
    if let Err(e) = std::fs::write(&dest, out) {
        panic!("writing {}: {e}", dest.display());
    }
}
