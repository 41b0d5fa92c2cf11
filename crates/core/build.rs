//! Generates `KernelId` from the kernel sources: every `extern "C" __global__ void name(`
//! in kernels-cuda/*.cu becomes a variant, so call sites name kernels by enum, never by
//! string, and a kernel missing from a backend is a compile error there.

use std::fmt::Write as _;
use std::path::Path;

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels-cuda");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|e| e == "cu"));
    files.sort();
    let mut kernels: Vec<(String, String)> = Vec::new(); // (kernel, module)
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
        let module = file
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("")
            .to_string();
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let marker = "extern \"C\" __global__ void ";
        let mut rest = text.as_str();
        while let Some(pos) = rest.find(marker) {
            rest = &rest[pos + marker.len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                kernels.push((name, module.clone()));
            }
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
    let mut modules: Vec<&str> = kernels.iter().map(|(_, m)| m.as_str()).collect();
    modules.dedup();
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
