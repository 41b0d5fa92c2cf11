//! Quantised matrix products, as ggml's mul_mat and mul_mat_id compute them: each
//! activation row is quantised once to the weight format's `vec_dot_type`
//! (strata_quant's `FormatKernels::act`), then every output is one `vec_dot` of a weight
//! row with a quantised activation row: computed by that `vec_dot`, or bit for bit by a
//! tile kernel (tiles.rs) that shares a weight row's unpacking between 8 activation rows
//! or an activation row between 4 (Q4_K: 8) weight rows.
//!
//! Work is split over weight rows. Within a task, a block of weight rows stays in L1
//! while a block of activation rows streams past, so for a batch (prefill, or the tokens
//! routed to one expert) each weight byte comes from memory once.

use std::cell::RefCell;

use super::check::{Format, elems, fits, format, prefix, prefix_mut};
use super::par::{self, DisjointOut};
use super::tiles::{COLS, ROWS, ROWS8, Tiles, small, tiles};
use crate::kernels::KernelArgs;

/// Weight rows kept in L1 while a block of activation rows passes (for k = 4096 in
/// Q4_K: 8 x 2.3 KiB).
const ROW_BLOCK: usize = 8;
/// Activation rows per block (for k = 4096: 32 x 4.6 KiB of Q8_K, in L2).
const COL_BLOCK: usize = 32;

thread_local! {
    /// The stream thread's buffer of quantised activations, reused across launches.
    static ACT_SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Quantises the `rows` activation rows of `x` (`rows * k` values) to `f`'s activation
/// format, over the pool for big batches, then runs `body` on them.
pub(super) fn with_quantised<R>(
    a: &KernelArgs<'_>,
    f: &Format,
    x: &[f32],
    k: usize,
    body: impl FnOnce(&[u8]) -> R,
) -> Result<R, String> {
    let rows = x.len().checked_div(k).unwrap_or(0);
    let bytes = rows * f.act_row_bytes;
    let quantise = |buf: &mut [u8]| {
        let per = par::items_per_task(a.pool, rows, k * 4);
        par::try_for_each_chunk(a.pool, buf, per * f.act_row_bytes, |i, qs| {
            for (j, q) in qs.chunks_exact_mut(f.act_row_bytes).enumerate() {
                let r = i * per + j;
                strata_quant::quantize_activation_into(f.kernels.act, &x[r * k..(r + 1) * k], q)
                    .map_err(|e| e.to_string())?;
            }
            Ok(())
        })
    };
    ACT_SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            buf.resize(bytes, 0);
            quantise(&mut buf[..bytes])?;
            Ok(body(&buf[..bytes]))
        }
        // Re-entered (cannot happen from a stream thread): use a fresh buffer.
        Err(_) => {
            let mut buf = vec![0u8; bytes];
            quantise(&mut buf)?;
            Ok(body(&buf))
        }
    })
}

/// strata_quant's Q4_K decode kernel for `ty == Q4_K` where this CPU has it (AVX-512
/// VNNI); `STRATA_CPU_Q4K_VNNI=0` keeps the AVX2 tile kernel (for A/B timing).
fn q4_k_rows8(ty: strata_quant::QuantType) -> Option<strata_quant::q4k_rows8::Rows8Fn> {
    static KERNEL: std::sync::OnceLock<Option<strata_quant::q4k_rows8::Rows8Fn>> =
        std::sync::OnceLock::new();
    if ty != strata_quant::QuantType::Q4_K {
        return None;
    }
    *KERNEL.get_or_init(|| {
        let off = std::env::var("STRATA_CPU_Q4K_VNNI").is_ok_and(|v| v == "0");
        if off {
            None
        } else {
            strata_quant::q4k_rows8::q4_k_rows8()
        }
    })
}

/// One weight matrix times a set of activation rows.
pub(super) struct Product<'a> {
    /// `m` rows of `f.row_bytes`.
    pub w: &'a [u8],
    /// (activation row, output row) pairs.
    pub cols: &'a [(usize, usize)],
}

/// A shared view of one launch's products: the quantised activations, the output
/// (`y[out_row * m + r]`) and the shapes.
pub(super) struct Gemm<'a> {
    pub f: Format,
    pub k: usize,
    pub m: usize,
    pub acts: &'a [u8],
    pub y: DisjointOut<'a, f32>,
    /// The format's tile kernels, when this CPU has them.
    pub tiles: Option<&'static Tiles>,
}

impl Gemm<'_> {
    fn act(&self, row: usize) -> &[u8] {
        let ab = self.f.act_row_bytes;
        &self.acts[row * ab..(row + 1) * ab]
    }

    /// Writes output `(out_row, r)`.
    fn put(&self, out_row: usize, r: usize, v: f32) {
        // SAFETY: every (output row, weight row) pair belongs to exactly one task: output
        // rows are distinct across a launch's columns, and the tasks of a product cover
        // disjoint weight-row ranges.
        unsafe { self.y.write(out_row * self.m + r, v) };
    }

    /// Output rows `r0..r1` of `p`, for all of its columns.
    pub(super) fn rows(&self, p: &Product<'_>, r0: usize, r1: usize) {
        let rb = self.f.row_bytes;
        let dot = self.f.kernels.vec_dot;
        let k = self.k;
        let w = |r: usize| &p.w[r * rb..(r + 1) * rb];
        match (self.tiles, p.cols) {
            // One activation row (decode): 8 or 4 weight rows against it at once where
            // the format has such a kernel, one at a time for the rest.
            (Some(t), &[(ai, oi)]) => {
                let act = self.act(ai);
                let mut r = r0;
                if let Some(rows8) = q4_k_rows8(self.f.ty).or(t.rows8) {
                    let mut out = [0f32; ROWS8];
                    // Tried: prefetching the next 8 rows (T0, a line at a time) while these
                    // are computed: twice slower from memory (EPYC, one thread).
                    while r + ROWS8 <= r1 {
                        rows8(k, &std::array::from_fn(|j| w(r + j)), act, &mut out);
                        for (j, &v) in out.iter().enumerate() {
                            self.put(oi, r + j, v);
                        }
                        r += ROWS8;
                    }
                }
                if let Some(rows4) = t.rows4 {
                    let mut out = [0f32; ROWS];
                    while r + ROWS <= r1 {
                        rows4(k, &std::array::from_fn(|j| w(r + j)), act, &mut out);
                        for (j, &v) in out.iter().enumerate() {
                            self.put(oi, r + j, v);
                        }
                        r += ROWS;
                    }
                }
                let mut out = [0f32; 1];
                for r in r..r1 {
                    (t.cols1)(k, w(r), &[act], &mut out);
                    self.put(oi, r, out[0]);
                }
            }
            // A small batch (a speculative verify window): each weight row read once for
            // all its activation rows, where the format has a panel kernel (tiles_small.rs).
            (Some(_), cols) if small::fits(cols.len()) && self.small_batch(p, cols, r0, r1) => {}
            // A batch: each weight row against COLS activation rows at once, a block of
            // weight rows staying in L1 while a block of activation rows streams past.
            (Some(t), cols) if cols.len() > 1 => {
                let (mut out8, mut out4) = ([0f32; COLS], [0f32; 4]);
                for b0 in (r0..r1).step_by(ROW_BLOCK) {
                    let b1 = (b0 + ROW_BLOCK).min(r1);
                    for chunk in cols.chunks(COL_BLOCK) {
                        for r in b0..b1 {
                            let row = w(r);
                            let mut eights = chunk.chunks_exact(COLS);
                            for c8 in &mut eights {
                                let acts = std::array::from_fn(|c| self.act(c8[c].0));
                                (t.cols8)(k, row, &acts, &mut out8);
                                for (&(_, oi), &v) in c8.iter().zip(&out8) {
                                    self.put(oi, r, v);
                                }
                            }
                            let mut fours = eights.remainder().chunks_exact(4);
                            for c4 in &mut fours {
                                let acts = std::array::from_fn(|c| self.act(c4[c].0));
                                (t.cols4)(k, row, &acts, &mut out4);
                                for (&(_, oi), &v) in c4.iter().zip(&out4) {
                                    self.put(oi, r, v);
                                }
                            }
                            let mut out1 = [0f32; 1];
                            for &(ai, oi) in fours.remainder() {
                                (t.cols1)(k, row, &[self.act(ai)], &mut out1);
                                self.put(oi, r, out1[0]);
                            }
                        }
                    }
                }
            }
            _ => {
                for b0 in (r0..r1).step_by(ROW_BLOCK) {
                    let b1 = (b0 + ROW_BLOCK).min(r1);
                    for cols in p.cols.chunks(COL_BLOCK) {
                        for r in b0..b1 {
                            let row = w(r);
                            for &(ai, oi) in cols {
                                self.put(oi, r, dot(k, row, self.act(ai)));
                            }
                        }
                    }
                }
            }
        }
    }

    /// Output rows `r0..r1` of `p` through a [`small::Panel`]; false (nothing written)
    /// when the format or this CPU has no panel kernel.
    fn small_batch(&self, p: &Product<'_>, cols: &[(usize, usize)], r0: usize, r1: usize) -> bool {
        if !small::has_kernel(self.f.ty) {
            return false;
        }
        let acts: Vec<&[u8]> = cols.iter().map(|&(ai, _)| self.act(ai)).collect();
        let Some(panel) = small::Panel::new(self.f.ty, self.k, &acts) else {
            return false;
        };
        // Blocks of weight rows, each column's outputs for a block written as one slice.
        const BLOCK: usize = 64;
        let rb = self.f.row_bytes;
        let mut out = [0f32; small::MAX_ROWS * BLOCK];
        for b0 in (r0..r1).step_by(BLOCK) {
            let b1 = (b0 + BLOCK).min(r1);
            panel.dot_rows(&p.w[b0 * rb..b1 * rb], rb, b1 - b0, &mut out, BLOCK);
            for (c, &(_, oi)) in cols.iter().enumerate() {
                // SAFETY: as `put`: these (output row, weight row) pairs are this task's.
                unsafe {
                    self.y
                        .write_slice(oi * self.m + b0, &out[c * BLOCK..][..b1 - b0])
                };
            }
        }
        true
    }

    /// Runs every product, split over the pool by ranges of weight rows.
    fn run(&self, pool: Option<&par::KernelPool>, products: &[Product<'_>]) {
        let tasks = row_tasks(pool, self.m, self.k, products, 1);
        par::for_each(pool, tasks.len(), |t| {
            let (i, r0, r1) = tasks[t];
            self.rows(&products[i], r0, r1);
        });
    }
}

/// `(product, first row, end row)` tasks covering every product's `m` weight rows, sized
/// so the pool balances (see [`par::task_work`]); `passes` is how many matrices of this
/// shape a task runs over its rows (2: gate and up).
pub(super) fn row_tasks(
    pool: Option<&par::KernelPool>,
    m: usize,
    k: usize,
    products: &[Product<'_>],
    passes: usize,
) -> Vec<(usize, usize, usize)> {
    let total: usize = products.iter().map(|p| passes * m * k * p.cols.len()).sum();
    let per_task = par::task_work(pool, total);
    if per_task != usize::MAX && shrinking_tasks() && products.iter().all(|p| p.cols.len() == 1) {
        return shrinking_row_tasks(par::threads(pool), m, passes * k, products.len());
    }
    let mut tasks = Vec::new();
    for (i, p) in products.iter().enumerate() {
        let row_work = (passes * k * p.cols.len()).max(1);
        let mut rows = (per_task / row_work).clamp(1, m.max(1));
        if rows > ROW_BLOCK {
            rows = rows.next_multiple_of(ROW_BLOCK);
        }
        tasks.extend((0..m).step_by(rows).map(|r0| (i, r0, (r0 + rows).min(m))));
    }
    tasks
}

/// Whether one-row launches split into shrinking tasks (`STRATA_CPU_SHRINKING_TASKS=0`:
/// equal ones, as batches, for A/B timing).
fn shrinking_tasks() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("STRATA_CPU_SHRINKING_TASKS").map_or(true, |v| v != "0"))
}

/// Tasks over `products` one-row products of `m` rows (decode: a matrix-vector product,
/// or one token's experts) that shrink toward the end of the launch, as guided scheduling
/// does: each takes 1/(2 x threads) of the rows left (a multiple of 8, for the 8-row
/// kernels), none below [`par::MIN_TASK_WORK`]. Threads claim tasks in order, so the big
/// ones go first and the last ones are small: a thread that starts late or runs slower (a
/// memory stall, a preemption) holds up the launch's end by a short task, not by a whole
/// share of equal tasks (4 a thread, a quarter of its work). `row_work`: units a row.
fn shrinking_row_tasks(
    threads: usize,
    m: usize,
    row_work: usize,
    products: usize,
) -> Vec<(usize, usize, usize)> {
    let min_rows = par::MIN_TASK_WORK
        .div_ceil(row_work.max(1))
        .next_multiple_of(ROWS8);
    let mut left = m * products;
    let mut tasks = Vec::new();
    for i in 0..products {
        let mut r0 = 0;
        while r0 < m {
            let rows = (left / (2 * threads.max(1)))
                .next_multiple_of(ROWS8)
                .max(min_rows);
            let r1 = (r0 + rows).min(m);
            tasks.push((i, r0, r1));
            left -= r1 - r0;
            r0 = r1;
        }
    }
    tasks
}

/// `y[n x m] = x[n x k] * w^T`.
pub fn mul_mat(a: &KernelArgs<'_>) -> Result<(), String> {
    const OP: &str = "mul_mat";
    let w = a.buf::<u8>(0)?;
    let x = a.buf::<f32>(1)?;
    let y = a.buf_mut::<f32>(2)?;
    let (type_id, m, k, n) = (
        a.u32(3)?,
        a.u32(4)? as usize,
        a.u32(5)? as usize,
        a.u32(6)? as usize,
    );
    let f = format(OP, type_id, k)?;
    let w = prefix(OP, "w (m rows of the format)", w, &[m, f.row_bytes])?;
    let x = prefix(OP, "x", x, &[n, k])?;
    let y = prefix_mut(OP, "y", y, &[n, m])?;
    if k == 0 {
        y.fill(0.0);
        return Ok(());
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    let cols: Vec<(usize, usize)> = (0..n).map(|i| (i, i)).collect();
    with_quantised(a, &f, x, k, |acts| {
        let gemm = Gemm {
            f,
            k,
            m,
            acts,
            y: DisjointOut::new(y),
            tiles: tiles(f.ty),
        };
        gemm.run(a.pool, &[Product { w, cols: &cols }]);
    })
}

/// A launch's (token, slot) pairs grouped by expert: which activation row each reads and
/// which output row it writes.
pub(super) struct Routes {
    /// (activation row, output row), sorted by expert (then by slot).
    cols: Vec<(usize, usize)>,
    /// (expert, first, end) ranges of `cols`.
    experts: Vec<(usize, usize, usize)>,
}

impl Routes {
    /// The pairs of `ids` (`n_used` slots per token); a pair reads activation row `s`
    /// (its slot) when `x_per_slot`, else its token's.
    pub fn new(op: &str, ids: &[i32], n_used: usize, x_per_slot: bool) -> Result<Self, String> {
        let mut slots = Vec::with_capacity(ids.len());
        for (s, &id) in ids.iter().enumerate() {
            let e = usize::try_from(id).map_err(|_| {
                format!(
                    "{op}: token {} slot {} has expert id {id}",
                    s / n_used.max(1),
                    s % n_used.max(1)
                )
            })?;
            let act_row = if x_per_slot { s } else { s / n_used };
            slots.push((e, act_row, s));
        }
        slots.sort_unstable();
        let cols = slots.iter().map(|&(_, ai, oi)| (ai, oi)).collect();
        let mut experts = Vec::new();
        let mut start = 0;
        while start < slots.len() {
            let e = slots[start].0;
            let end = start + slots[start..].iter().take_while(|s| s.0 == e).count();
            experts.push((e, start, end));
            start = end;
        }
        Ok(Routes { cols, experts })
    }

    /// One product per routed expert: its `matrix_bytes` at `e * expert_bytes` of `w`,
    /// checked to lie inside `w`.
    pub fn products<'a>(
        &'a self,
        op: &str,
        w: &'a [u8],
        expert_bytes: usize,
        matrix_bytes: usize,
    ) -> Result<Vec<Product<'a>>, String> {
        self.experts
            .iter()
            .map(|&(e, start, end)| {
                let base = e
                    .checked_mul(expert_bytes)
                    .filter(|b| b.checked_add(matrix_bytes).is_some())
                    .ok_or_else(|| format!("{op}: expert id {e} overflows the weight offset"))?;
                fits(
                    op,
                    &format!("expert {e}'s weights (bytes)"),
                    base + matrix_bytes,
                    w.len(),
                )?;
                Ok(Product {
                    w: &w[base..base + matrix_bytes],
                    cols: &self.cols[start..end],
                })
            })
            .collect()
    }
}

/// `y[t][j] = x' * W_e^T` for the expert `e = ids[t][j]` of every token's slots.
pub fn mul_mat_experts(a: &KernelArgs<'_>) -> Result<(), String> {
    const OP: &str = "mul_mat_experts";
    let w = a.buf::<u8>(0)?;
    let x = a.buf::<f32>(1)?;
    let ids = a.buf::<i32>(2)?;
    let y = a.buf_mut::<f32>(3)?;
    let (type_id, m, k) = (a.u32(4)?, a.u32(5)? as usize, a.u32(6)? as usize);
    let (n_tokens, n_used) = (a.u32(7)? as usize, a.u32(8)? as usize);
    let x_per_slot = a.u32(9)? != 0;
    let expert_bytes = usize::try_from(a.u64(10)?)
        .map_err(|_| format!("{OP}: expert_bytes does not fit this machine's addresses"))?;
    let f = format(OP, type_id, k)?;
    let matrix_bytes = elems(OP, "an expert's matrix", &[m, f.row_bytes])?;
    if expert_bytes < matrix_bytes {
        return Err(format!(
            "{OP}: expert_bytes {expert_bytes} is smaller than one {m} x {k} {} matrix ({matrix_bytes} bytes)",
            f.ty.name()
        ));
    }
    let ids = prefix(OP, "ids", ids, &[n_tokens, n_used])?;
    let x_rows = if x_per_slot {
        n_tokens * n_used
    } else {
        n_tokens
    };
    let x = prefix(OP, "x", x, &[x_rows, k])?;
    let y = prefix_mut(OP, "y", y, &[n_tokens, n_used, m])?;
    let routes = Routes::new(OP, ids, n_used, x_per_slot)?;
    let products = routes.products(OP, w, expert_bytes, matrix_bytes)?;
    if k == 0 {
        y.fill(0.0);
        return Ok(());
    }
    if m == 0 || products.is_empty() {
        return Ok(());
    }
    with_quantised(a, &f, x, k, |acts| {
        let gemm = Gemm {
            f,
            k,
            m,
            acts,
            y: DisjointOut::new(y),
            tiles: tiles(f.ty),
        };
        gemm.run(a.pool, &products);
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// Shrinking tasks cover every row of every product once, in order, in multiples
    /// of 8 rows but at a product's end, never growing within the launch, none below the
    /// minimum work; the last ones small.
    #[test]
    fn shrinking_row_tasks_cover_each_row_once() {
        for (threads, m, row_work, products) in [
            (16, 768, 4096, 8),
            (16, 2048, 768, 8),
            (2, 768, 4096, 8),
            (3, 100, 256, 3),
            (7, 4096, 4096, 1),
            (4, 5, 10_000, 2),
        ] {
            let tasks = shrinking_row_tasks(threads, m, row_work, products);
            let mut next = (0, 0);
            let mut prev = usize::MAX;
            for &(i, r0, r1) in &tasks {
                if next.1 == m {
                    next = (next.0 + 1, 0);
                }
                assert_eq!(
                    (i, r0),
                    next,
                    "{threads} {m} {row_work} {products}: {tasks:?}"
                );
                assert!(r1 > r0 && r1 <= m);
                let rows = r1 - r0;
                if r1 < m {
                    assert_eq!(rows % ROWS8, 0);
                    assert!(rows * row_work >= par::MIN_TASK_WORK);
                    assert!(rows <= prev, "tasks grew: {tasks:?}");
                    prev = rows;
                }
                next = (i, r1);
            }
            assert_eq!(next, (products - 1, m));
            let min_rows = par::MIN_TASK_WORK
                .div_ceil(row_work)
                .next_multiple_of(ROWS8);
            let last = tasks.last().unwrap();
            assert!(last.2 - last.1 <= min_rows.max(ROWS8));
        }
    }

    /// One-row products split into shrinking tasks give the bits of one task a product,
    /// and those are each row's `vec_dot` (the 8-row, 4-row and one-row kernels that a
    /// split's pieces end in all equal it), rows not a multiple of 8 included.
    #[test]
    fn shrinking_tasks_give_the_bits_of_one_task_a_product() {
        let ty = strata_quant::QuantType::Q4_K;
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for (m, k, products) in [(100usize, 768usize, 3usize), (264, 512, 2), (2048, 768, 2)] {
            let f = format("test", ty.id(), k).unwrap();
            let rb = f.row_bytes;
            let mut w: Vec<u8> = (0..products * m * rb).map(|_| next() as u8).collect();
            for block in w.chunks_exact_mut(144) {
                // Finite f16 d and dmin (about 0.01).
                block[..4].copy_from_slice(&[0x1f, 0x20, 0x1f, 0x20]);
            }
            let x: Vec<f32> = (0..products * k)
                .map(|_| (next() % 2001) as f32 / 500.0 - 2.0)
                .collect();
            let ab = f.act_row_bytes;
            let mut acts = vec![0u8; products * ab];
            for (xr, q) in x.chunks_exact(k).zip(acts.chunks_exact_mut(ab)) {
                strata_quant::quantize_activation_into(f.kernels.act, xr, q).unwrap();
            }
            let cols: Vec<[(usize, usize); 1]> = (0..products).map(|p| [(p, p)]).collect();
            let prods: Vec<Product<'_>> = (0..products)
                .map(|p| Product {
                    w: &w[p * m * rb..(p + 1) * m * rb],
                    cols: &cols[p],
                })
                .collect();
            let run = |tasks: &[(usize, usize, usize)]| {
                let mut y = vec![f32::NAN; products * m];
                let g = Gemm {
                    f,
                    k,
                    m,
                    acts: &acts,
                    y: DisjointOut::new(&mut y),
                    tiles: tiles(ty),
                };
                for &(i, r0, r1) in tasks {
                    g.rows(&prods[i], r0, r1);
                }
                y
            };
            let whole: Vec<_> = (0..products).map(|i| (i, 0, m)).collect();
            let want = run(&whole);
            for (i, v) in want.iter().enumerate() {
                let (p, r) = (i / m, i % m);
                let dot = (f.kernels.vec_dot)(
                    k,
                    &prods[p].w[r * rb..(r + 1) * rb],
                    &acts[p * ab..][..ab],
                );
                assert_eq!(
                    v.to_bits(),
                    dot.to_bits(),
                    "m={m} k={k} product {p} row {r}"
                );
            }
            for threads in [2, 3, 16] {
                let got = run(&shrinking_row_tasks(threads, m, k, products));
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "m={m} k={k} threads {threads} output {i}"
                    );
                }
            }
        }
    }

    /// Timing, not a check: `cargo test --release -p strata-backend-cpu q4_k_rows8_speed
    /// -- --ignored --nocapture`. The best of many short runs from cache (a preempted
    /// run only ever looks slower).
    #[test]
    #[ignore]
    fn q4_k_rows8_speed() {
        let ty = strata_quant::QuantType::Q4_K;
        let (Some(t), Some(vnni)) = (tiles(ty), q4_k_rows8(ty)) else {
            return;
        };
        let Some(avx2) = t.rows8 else { return };
        // 768 and 2048: a Qwen3-30B-A3B expert's down and gate/up rows.
        for k in [768, 1024, 2048, 4096] {
            let rows: Vec<Vec<u8>> = (0..ROWS8)
                .map(|r| {
                    let mut v: Vec<u8> = (0..k / 256 * 144).map(|i| (i * 7 + r) as u8).collect();
                    for b in v.chunks_exact_mut(144) {
                        b[..4].copy_from_slice(&[0, 0x20, 0, 0x1c]);
                    }
                    v
                })
                .collect();
            let x: Vec<f32> = (0..k).map(|i| ((i * 13) % 17) as f32 - 8.0).collect();
            let mut act = vec![0u8; k / 256 * 292];
            strata_quant::quantize_activation_into(strata_quant::ActFormat::Q8_K, &x, &mut act)
                .unwrap();
            let refs: [&[u8]; ROWS8] = std::array::from_fn(|r| rows[r].as_slice());
            for (name, f) in [
                ("avx2", avx2),
                ("vnni", vnni),
                ("avx2", avx2),
                ("vnni", vnni),
            ] {
                let mut best = f64::MAX;
                let mut out = [0f32; ROWS8];
                for _ in 0..200 {
                    let t0 = std::time::Instant::now();
                    for _ in 0..1000 {
                        f(k, &refs, std::hint::black_box(&act), &mut out);
                    }
                    best = best.min(t0.elapsed().as_secs_f64());
                }
                println!(
                    "{name}: {:.1} ns per 8 rows x {k} ({:.1} ns a block)",
                    best * 1e6,
                    best * 1e6 / (k / 256 * 8) as f64
                );
            }
        }
    }
}
