//! `strata devices`: the backends compiled in and the devices each finds.

use strata_core::DeviceInfo;

#[derive(clap::Args)]
pub struct Args {}

fn gib(bytes: usize) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

fn print_device(d: &DeviceInfo, free: Option<usize>) {
    let free = free.map_or(String::new(), |f| format!(", {:.1} GiB free", gib(f)));
    println!(
        "  {}:{}  {}  [{}]  {:.1} GiB{}",
        d.backend.name(),
        d.ordinal,
        d.name,
        d.arch,
        gib(d.total_memory),
        free
    );
}

pub fn run(_args: Args) -> anyhow::Result<()> {
    println!("cpu: always built");
    let cpu = strata_backend_cpu::device(strata_backend_cpu::CpuOptions::from_env())?;
    let free = cpu.memory().ok().map(|m| m.free);
    print_device(cpu.info(), free);
    cuda();
    hip();
    Ok(())
}

#[cfg(feature = "cuda")]
fn cuda() {
    match strata_backend_cuda::devices() {
        Ok(list) if list.is_empty() => println!("cuda: driver found, but no CUDA device"),
        Ok(list) => {
            println!("cuda: {} device(s)", list.len());
            for d in &list {
                print_device(d, None);
            }
        }
        Err(e) => println!("cuda: {e}"),
    }
}

#[cfg(not(feature = "cuda"))]
fn cuda() {
    println!("cuda: not built (rebuild with --features cuda)");
}

#[cfg(feature = "hip")]
fn hip() {
    let runtime = strata_backend_hip::runtime_version()
        .map(|(a, b, c)| format!("HIP runtime {a}.{b}.{c}"))
        .unwrap_or_default();
    match strata_backend_hip::devices() {
        Ok(list) if list.is_empty() => println!("hip: {runtime} found, but no AMD GPU"),
        Ok(list) => {
            println!("hip: {} device(s), {runtime}", list.len());
            for d in &list {
                print_device(d, None);
            }
        }
        Err(e) => println!("hip: {e}"),
    }
}

#[cfg(not(feature = "hip"))]
fn hip() {
    println!("hip: not built (rebuild with --features hip)");
}
