//! argmax_rows (kernels.txt) against [`argmax_row`], the host's greedy choice: ties to the
//! lowest index (inside a piece and across pieces), NaN below every number, -0 equal to
//! +0, rows of NaN or -inf, row lengths that are not a multiple of any block size, several
//! rows a launch, any split and launch shape, the tickets back at 0 after every launch,
//! and replays of a captured launch reading new logits.

use crate::{
    Args, Device, DeviceBuffer, Error, KernelId, LaunchCfg, Result, Stream, argmax_row,
    argmax_split,
};

fn fail(what: String) -> Error {
    Error::Capture(format!("conformance failure (argmax_rows): {what}"))
}

/// Deterministic values in [-4, 4).
fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 8000) as f32 / 1000.0 - 4.0
        })
        .collect()
}

/// Rows of `n` values with the answer each must give (`n` >= 16).
fn rows(n: usize, seed: u32) -> Vec<(Vec<f32>, u32)> {
    let nan = f32::NAN;
    let at = |base: Vec<f32>, set: &[(usize, f32)]| {
        let mut r = base;
        for &(i, v) in set {
            r[i] = v;
        }
        r
    };
    let (mid, last) = (n / 2 + 1, n - 1);
    vec![
        // The maximum twice, the later one in another piece of a split row.
        (at(values(n, seed), &[(3, 9.0), (mid, 9.0), (last, 9.0)]), 3),
        (at(values(n, seed + 1), &[(last, 9.0)]), last as u32),
        (vec![1.0; n], 0),
        (
            at(values(n, seed + 2), &[(0, nan), (2, 7.5), (last, 7.5)]),
            2,
        ),
        (vec![nan; n], 0),
        (vec![f32::NEG_INFINITY; n], 0),
        (at(vec![nan; n], &[(mid, f32::NEG_INFINITY)]), mid as u32),
        (
            at(
                values(n, seed + 3),
                &[(5, nan), (9, f32::INFINITY), (mid, f32::INFINITY)],
            ),
            9,
        ),
        // -0 equals +0: the lower index of the two, whichever sign it has.
        (at(vec![-1.0; n], &[(7, -0.0), (mid, 0.0)]), 7),
        (at(vec![-1.0; n], &[(7, 0.0), (mid, -0.0)]), 7),
        // The smallest subnormal is above zero.
        (at(vec![0.0; n], &[(last, f32::from_bits(1))]), last as u32),
        (
            at(vec![nan; n], &[(1, -3.0), (mid, -2.0), (last, -2.0)]),
            mid as u32,
        ),
    ]
}

#[allow(clippy::too_many_arguments)]
fn launch(
    dev: &Device,
    x: &DeviceBuffer<f32>,
    ids: &DeviceBuffer<u32>,
    partial: &DeviceBuffer<u64>,
    done: &DeviceBuffer<u32>,
    n_rows: usize,
    n_cols: usize,
    n_split: u32,
    cfg: &LaunchCfg,
    s: Stream,
) -> Result<()> {
    let args = Args::new()
        .read(x)
        .write(ids)
        .read_write(partial)
        .read_write(done)
        .u32(n_rows as u32)
        .u32(n_cols as u32)
        .u32(n_split);
    dev.launch(KernelId::ArgmaxRows, cfg, &args, s)
}

/// The device's answers for `rows` (each `n_cols` long) in `n_split` pieces with blocks
/// of `block` threads, `grid` blocks (0: one per piece), launched twice.
fn run(
    dev: &Device,
    rows: &[(Vec<f32>, u32)],
    n_cols: usize,
    n_split: u32,
    block: u32,
    grid: u32,
) -> Result<()> {
    let s = dev.create_stream()?;
    let n_rows = rows.len();
    let flat: Vec<f32> = rows.iter().flat_map(|(r, _)| r.iter().copied()).collect();
    let x = dev.alloc_from(&flat, s)?;
    let ids = dev.alloc_from(&vec![u32::MAX; n_rows], s)?;
    let partial = dev.alloc::<u64>(n_rows * n_split as usize)?;
    let done = dev.alloc_from(&vec![0u32; n_rows], s)?;
    let units = n_rows * n_split as usize;
    let grid = if grid == 0 { units as u32 } else { grid };
    let cfg = LaunchCfg {
        grid: [grid, 1, 1],
        block: [block, 1, 1],
        shared_bytes: 0,
    };
    for round in 0..2 {
        launch(
            dev, &x, &ids, &partial, &done, n_rows, n_cols, n_split, &cfg, s,
        )?;
        let got = dev.download(&ids, s)?.wait()?;
        let tickets = dev.download(&done, s)?.wait()?;
        for (r, ((row, want), got)) in rows.iter().zip(&got).enumerate() {
            if argmax_row(row) != *want {
                return Err(fail(format!(
                    "the host rule gives {} for row {r} of {n_cols}, expected {want}",
                    argmax_row(row)
                )));
            }
            if got != want {
                return Err(fail(format!(
                    "row {r} of {n_cols} values ({n_split} pieces, {grid} x {block} threads, \
                     launch {round}): {got}, expected {want}"
                )));
            }
        }
        if let Some(r) = tickets.iter().position(|&t| t != 0) {
            return Err(fail(format!(
                "row {r}'s ticket is {} after launch {round}, not 0",
                tickets[r]
            )));
        }
    }
    dev.synchronize()
}

/// Every row kind at several lengths, splits and launch shapes.
pub fn argmax_rows(dev: &Device) -> Result<()> {
    if !dev.supports(KernelId::ArgmaxRows) {
        return Ok(());
    }
    // Not multiples of 32; 12,302 spans several pieces; 70,001 is argmax_split's 18.
    for (n, seed) in [(17usize, 1u32), (1000, 2), (12_302, 3), (70_001, 4)] {
        let cases = rows(n, seed);
        let auto = argmax_split(n as u32);
        for (split, block, grid) in [(auto, 256, 0), (1, 256, 0), (5, 128, 0), (3, 64, 4)] {
            run(dev, &cases, n, split, block, grid)?;
        }
    }
    // One value a row: more pieces than values leaves pieces empty.
    let single = vec![
        (vec![f32::NAN], 0),
        (vec![-5.0], 0),
        (vec![f32::INFINITY], 0),
    ];
    run(dev, &single, 1, 1, 32, 0)?;
    run(dev, &single, 1, 4, 32, 0)?;
    graph_replays(dev)
}

/// A captured launch replays over logits uploaded in place between replays.
fn graph_replays(dev: &Device) -> Result<()> {
    let (copy, s) = (dev.create_stream()?, dev.create_stream()?);
    let (n_rows, n_cols) = (3usize, 49_152usize);
    let split = argmax_split(n_cols as u32);
    let x = dev.alloc::<f32>(n_rows * n_cols)?;
    let ids = dev.alloc::<u32>(n_rows)?;
    let partial = dev.alloc::<u64>(n_rows * split as usize)?;
    let done = dev.alloc_from(&vec![0u32; n_rows], s)?;
    let cfg = LaunchCfg::linear(n_rows * split as usize * 256, 256);
    let mut graph = dev.capture(s, |d| {
        launch(d, &x, &ids, &partial, &done, n_rows, n_cols, split, &cfg, s)
    })?;
    for i in 0..6u32 {
        let mut host = values(n_rows * n_cols, 100 + i);
        let want: Vec<u32> = (0..n_rows)
            .map(|r| {
                // A different winner each time, tied with a later copy.
                let at = (i as usize * 7_919 + r * 4_099) % (n_cols - 1);
                host[r * n_cols + at] = 5.0;
                host[r * n_cols + n_cols - 1] = 5.0;
                at as u32
            })
            .collect();
        dev.upload(&x, &host, copy)?;
        dev.replay(&mut graph, s)?;
        let got = dev.download(&ids, copy)?.wait()?;
        if got != want {
            return Err(fail(format!("replay {i}: {got:?}, expected {want:?}")));
        }
    }
    dev.synchronize()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_rule() {
        let nan = f32::NAN;
        assert_eq!(argmax_row(&[]), 0);
        assert_eq!(argmax_row(&[0.1, 2.0, 2.0, -1.0]), 1);
        assert_eq!(argmax_row(&[nan, -1.0, 3.0, 3.0]), 2);
        assert_eq!(argmax_row(&[nan, nan]), 0);
        assert_eq!(argmax_row(&[nan, f32::NEG_INFINITY]), 1);
        assert_eq!(argmax_row(&[-0.0, 0.0]), 0);
        assert_eq!(argmax_row(&[0.0, -0.0, f32::from_bits(1)]), 2);
        for (row, want) in rows(40, 9) {
            assert_eq!(argmax_row(&row), want);
        }
    }
}
