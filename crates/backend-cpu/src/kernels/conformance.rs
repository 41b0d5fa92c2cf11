//! CPU versions of kernels-cuda/conformance.cu.

use super::KernelArgs;

fn count(n: u32, len: usize, what: &str) -> Result<usize, String> {
    let n = n as usize;
    if n > len {
        return Err(format!("{what}: n = {n} exceeds the buffer ({len})"));
    }
    Ok(n)
}

pub fn fill_u32(a: &KernelArgs<'_>) -> Result<(), String> {
    let dst = a.buf_mut::<u32>(0)?;
    let n = count(a.u32(1)?, dst.len(), "fill_u32")?;
    dst[..n].fill(a.u32(2)?);
    Ok(())
}

pub fn add_u32(a: &KernelArgs<'_>) -> Result<(), String> {
    let src = a.buf::<u32>(0)?;
    let dst = a.buf_mut::<u32>(1)?;
    let n = count(a.u32(2)?, src.len().min(dst.len()), "add_u32")?;
    let addend = a.u32(3)?;
    for (d, s) in dst[..n].iter_mut().zip(&src[..n]) {
        *d = s.wrapping_add(addend);
    }
    Ok(())
}

pub fn check_table(a: &KernelArgs<'_>) -> Result<(), String> {
    let table = a.buf::<i32>(0)?;
    let flags = a.buf_mut::<u32>(1)?;
    let n = count(a.u32(2)?, table.len(), "check_table")?;
    let expected = a.i32(3)?;
    let slot = a.u32(4)? as usize;
    if slot >= flags.len() {
        return Err(format!(
            "check_table: slot {slot} outside flags ({})",
            flags.len()
        ));
    }
    if table[..n].iter().any(|&v| v != expected) {
        flags[slot] = 1;
    }
    Ok(())
}

pub fn busy_wait(a: &KernelArgs<'_>) -> Result<(), String> {
    let sink = a.buf_mut::<u32>(0)?;
    let ns = a.u64(1)?;
    let start = std::time::Instant::now();
    while (start.elapsed().as_nanos() as u64) < ns {
        std::hint::spin_loop();
    }
    if let Some(s) = sink.first_mut() {
        *s = s.wrapping_add(1);
    }
    Ok(())
}
