//! The CPU backend: strata's default device, and in sanitizer mode the proof that the
//! engine orders every device access.

mod backend;
pub mod kernels;
mod memory;
mod profile;
mod sanitizer;
mod shared;
mod worker;

pub use backend::CpuBackend;
pub use profile::{PoolUtilisation, pool_utilisation};

use strata_core::{Device, Result};

/// How the CPU device behaves.
#[derive(Clone, Debug)]
pub struct CpuOptions {
    /// Check every access against the fences it should have waited for, and land
    /// uploads after a random simulated DMA delay.
    pub sanitize: bool,
    /// Upper bound of the simulated DMA delay in sanitizer mode.
    pub max_dma_delay_us: u64,
    /// Pretend the device has this many bytes (to exercise out-of-memory paths).
    pub memory_limit: Option<usize>,
    /// Seed of the delay generator.
    pub seed: u64,
    /// Threads the heavy kernels (mul_mat, attention, ...) are split over; `None` means
    /// one per physical core this process may run on.
    pub threads: Option<usize>,
    /// Imported host memory (model weights) is copied into memory with transparent huge
    /// pages (blocks under 2 MiB packed together), up to half of the device's memory, and
    /// the borrowed file pages are dropped from the resident set: streaming weights on
    /// 4 KiB pages costs a TLB miss every page (measured 35-50% slower on a VM).
    pub huge_pages: bool,
    /// How long an idle stream thread polls its queue before it sleeps, in microseconds
    /// (`None`: 0; [`CpuOptions::from_env`] takes `STRATA_CPU_STREAM_SPIN_US`). The expert
    /// cache's CPU pool asks for [`POOL_STREAM_SPIN_US`]: its stream gets a layer's work
    /// every few hundred microseconds of a decode step, and waking a sleeping thread for
    /// each cost more.
    pub stream_spin_us: Option<u64>,
}

/// The CPU pool's stream spin (see [`CpuOptions::stream_spin_us`]). H200 host, 16 threads,
/// Qwen3-30B-A3B-shaped Q4_K with a 25% expert cache, tg64 tokens/s in alternating runs:
/// 0 us 79.8 / 88.5, 50 us 90.8 / 95.5, 200 us 100.0 (the pool's share of a token 6.1 /
/// 5.0 -> 3.8 ms); with no cache 38.6 against 39.0 at 50 us. pp512 at 25%: 918.6 / 910.8
/// without, 884.7 / 873.4 with 200 us.
pub const POOL_STREAM_SPIN_US: u64 = 200;

impl Default for CpuOptions {
    fn default() -> Self {
        CpuOptions {
            sanitize: false,
            max_dma_delay_us: 200,
            memory_limit: None,
            seed: 0x5EED,
            threads: None,
            huge_pages: true,
            stream_spin_us: None,
        }
    }
}

impl CpuOptions {
    /// Defaults, with `sanitize` on when `STRATA_SANITIZE=1`, the kernel threads from
    /// `STRATA_CPU_THREADS` when it holds a number, and weights borrowed in place (not
    /// copied to huge pages) when `STRATA_CPU_HUGEPAGES=0`.
    pub fn from_env() -> Self {
        CpuOptions {
            sanitize: std::env::var("STRATA_SANITIZE").is_ok_and(|v| v == "1"),
            threads: std::env::var("STRATA_CPU_THREADS")
                .ok()
                .and_then(|v| v.trim().parse().ok()),
            huge_pages: std::env::var("STRATA_CPU_HUGEPAGES").map_or(true, |v| v != "0"),
            stream_spin_us: std::env::var("STRATA_CPU_STREAM_SPIN_US")
                .ok()
                .and_then(|v| v.trim().parse().ok()),
            ..Default::default()
        }
    }
}

/// A device over the CPU backend.
pub fn device(opts: CpuOptions) -> Result<Device> {
    Device::new(Box::new(CpuBackend::new(opts)?))
}
