//! Page-locking the mapped model file for the device, so that every upload of experts from
//! it (cache fills, a trim's refills, a long prompt's staged layers, experts streamed during
//! decode) goes to the device by DMA straight from the file's pages, without a host copy
//! into staging first. That copy ran at ~20 GB/s on the cores the CPU pool needs; DMA from
//! page-locked memory runs at the bus's speed and costs the host nothing.
//!
//! Page-locked memory cannot be evicted, so `auto` locks the file only when it takes at
//! most three quarters of the machine's memory.

use std::sync::Arc;
use std::time::Instant;

use strata_core::{Device, HostMemory};
use strata_gguf::GgufFile;

/// Whether the mapped model file is page-locked for the device (`--pin-file`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PinFile {
    /// When the file takes at most 3/4 of the machine's memory.
    #[default]
    Auto,
    On,
    Off,
}

impl std::str::FromStr for PinFile {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(PinFile::Auto),
            "on" => Ok(PinFile::On),
            "off" => Ok(PinFile::Off),
            _ => Err(format!("expected auto, on or off, got `{s}`")),
        }
    }
}

struct FileBytes(Arc<GgufFile>);

impl HostMemory for FileBytes {
    fn bytes(&self) -> &[u8] {
        self.0.bytes()
    }
}

/// Page-locks `gguf`'s mapping for `dev` as `mode` says, on a machine of `host_memory`
/// bytes (the CPU pool's device reports it); whether it is now. Never fails: a refusal (no
/// support, no memory) is logged, and uploads stage as before.
pub fn pin_file(dev: &Device, gguf: &Arc<GgufFile>, mode: PinFile, host_memory: u64) -> bool {
    let size = gguf.bytes().len() as u64;
    let gib = size as f64 / (1u64 << 30) as f64;
    match mode {
        PinFile::Off => return false,
        PinFile::On => {}
        PinFile::Auto if size <= host_memory / 4 * 3 => {}
        PinFile::Auto => {
            tracing::info!(
                "expert cache: the model file ({gib:.1} GiB) is more than 3/4 of memory ({:.1} GiB): not page-locked; uploads from it are staged (--pin-file on to lock it anyway)",
                host_memory as f64 / (1u64 << 30) as f64
            );
            return false;
        }
    }
    let t0 = Instant::now();
    match dev.register_host(Arc::new(FileBytes(gguf.clone()))) {
        Ok(true) => {
            tracing::info!(
                "expert cache: the model file ({gib:.1} GiB) is registered with {} in {:.2} s: uploads from it go straight from its pages, without staging",
                dev.info().name,
                t0.elapsed().as_secs_f64()
            );
            true
        }
        Ok(false) => false,
        Err(e) => {
            tracing::warn!(
                "expert cache: page-locking the model file ({gib:.1} GiB) failed ({e}); uploads from it are staged"
            );
            false
        }
    }
}
