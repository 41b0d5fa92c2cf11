//! Typed launchers for the transformer kernels: the one place that knows each kernel's
//! argument order (crates/core/kernels.txt). Every launch goes through the ordered API.

use strata_core::{
    ATTENTION_ROWS_MAX_TOKENS, Args, Device, DeviceBuffer, DeviceSlice, KernelId, LaunchCfg,
    Result, Stream, argmax_split,
};
use strata_gguf::QuantType;

use crate::hparams::Rope;
use crate::weights::{Experts, Matrix, Vector};

const BLOCK: u32 = 256;
/// Weight rows one 256-thread block of mul_mat computes per unit (8 warps x 2 rows) and
/// activation rows per tile: the GPU kernels are grid-stride loops over such units, so the
/// grid is sized to the unit count (kernels-cuda/matmul.cuh). CPU kernels ignore shapes.
const MM_ROWS_PER_BLOCK: usize = 16;
const MM_TOKENS_PER_TILE: usize = 8;
/// Above this many tokens the GPU mul_mat_experts groups the pairs by expert
/// (kernels-cuda/model.cu's MOE_GROUP_MIN_TOKENS).
const EXPERT_GROUPING_MIN_TOKENS: u32 = 2;

/// `n` independent items (one thread each).
fn cfg(n: usize) -> LaunchCfg {
    LaunchCfg::linear(n, BLOCK)
}

/// `units` blocks of 256 threads (one work unit per block).
fn blocks(units: usize) -> LaunchCfg {
    LaunchCfg::linear(units.max(1) * BLOCK as usize, BLOCK)
}

/// A matmul launch over `m` weight rows times `other` units (token tiles, slots or
/// experts): 256-thread blocks of 16 rows, or for decode-sized work 128-thread blocks of 8
/// rows (twice the blocks, so a 512-row matrix reaches 64 SMs instead of 32; the kernels
/// take any block of whole warps, and a row's arithmetic does not depend on it).
fn mm_blocks(m: u32, other: usize, decode: bool) -> LaunchCfg {
    let (threads, rows) = if decode {
        (BLOCK / 2, MM_ROWS_PER_BLOCK / 2)
    } else {
        (BLOCK, MM_ROWS_PER_BLOCK)
    };
    let units = (m as usize).div_ceil(rows) * other.max(1);
    LaunchCfg::linear(units * threads as usize, threads)
}

/// A one-token product (the CUDA backend's matvec.cuh kernels): 128-thread blocks of
/// `rows` rows (4 warps of MV_ROWS = 2 rows, or of 1 gate/up row pair).
fn mv_blocks(m: u32, other: usize, rows: usize) -> LaunchCfg {
    let units = (m as usize).div_ceil(rows) * other.max(1);
    LaunchCfg::linear(units * (BLOCK / 2) as usize, BLOCK / 2)
}

/// A product of `n` tokens with float weights (no activation to quantise per block, so
/// nothing is repeated by having more blocks): one-warp blocks of MV_ROWS = 2 rows per
/// token, four times the blocks of `mv_blocks` (a 128-row router reaches 64 SMs instead of
/// 16; a verify window's, 64 blocks a token where the tiled form had 16 in all).
fn mv_float_blocks(m: u32, n: u32) -> LaunchCfg {
    LaunchCfg::linear((m as usize).div_ceil(2) * n.max(1) as usize * 32, 32)
}

/// The most tokens a float-weight product launches as [`mv_float_blocks`] (a verify
/// window's router; the CUDA backend's mul_mat_vec_f takes as many, variants.rs).
const MV_FLOAT_MAX_TOKENS: u32 = 8;

/// One block per row of `dim` values, about 8 values a thread (32 to 256 threads).
fn block_per_row(rows: usize, dim: usize) -> LaunchCfg {
    let threads = row_block_threads(dim as u32);
    LaunchCfg::linear(rows.max(1) * threads as usize, threads)
}

/// Threads of [`block_per_row`]'s blocks for rows of `dim` values. The fused products
/// that end in a norm (ops_decode.rs) run blocks of this size so their last block
/// normalises exactly as the separate norm kernels do.
pub(crate) fn row_block_threads(dim: u32) -> u32 {
    dim.div_ceil(8).next_multiple_of(32).clamp(32, BLOCK)
}

/// One 32-lane warp per row.
fn warp_per_row(rows: usize) -> LaunchCfg {
    LaunchCfg::linear(rows * 32, BLOCK)
}

/// The head shape, norm flag and rope scalars that end qk_norm_rope_store's arguments (and
/// mul_mat_qkv_rope's, which runs the same per-head code).
pub(crate) fn head_rope_args<'a>(
    args: Args<'a>,
    shape: &QkvShape,
    norm: bool,
    eps: f32,
    r: &Rope,
) -> Args<'a> {
    args.u32(shape.n_tokens)
        .u32(shape.n_head)
        .u32(shape.n_kv_head)
        .u32(shape.head_dim)
        .u32(shape.n_ctx)
        .u32(norm as u32)
        .f32(eps)
        .u32(r.n_rot)
        .u32(r.mode as u32)
        .f32(r.freq_base)
        .f32(r.freq_scale)
        .f32(r.ext_factor)
        .f32(r.attn_factor)
        .f32(r.beta_fast)
        .f32(r.beta_slow)
        .u32(r.n_ctx_orig)
}

/// A device and the stream the forward pass runs on.
#[derive(Clone, Copy)]
pub struct Ops<'a> {
    pub dev: &'a Device,
    pub stream: Stream,
}

impl Ops<'_> {
    #[track_caller]
    fn launch(&self, k: KernelId, n: usize, args: Args<'_>) -> Result<()> {
        self.launch_cfg(k, cfg(n), args)
    }

    #[track_caller]
    pub(crate) fn launch_cfg(&self, k: KernelId, cfg: LaunchCfg, args: Args<'_>) -> Result<()> {
        self.dev.launch(k, &cfg, &args, self.stream)
    }

    pub fn embed_rows(
        &self,
        table: &Matrix,
        ids: &DeviceBuffer<u32>,
        out: &DeviceBuffer<f32>,
        n_tokens: u32,
    ) -> Result<()> {
        let args = Args::new()
            .read(&table.buf)
            .read(ids)
            .write(out)
            .u32(table.ty.id())
            .u32(table.k)
            .u32(n_tokens);
        self.launch(KernelId::EmbedRows, (n_tokens * table.k) as usize, args)
    }

    /// `y[r] = rmsnorm(x[r]) * w` for `n_rows` rows of `w.len` (rows start at element
    /// offsets `x_off`/`y_off`).
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm(
        &self,
        x: &DeviceBuffer<f32>,
        x_off: usize,
        w: &Vector,
        y: &DeviceBuffer<f32>,
        y_off: usize,
        n_rows: u32,
        eps: f32,
    ) -> Result<()> {
        let args = Args::new()
            .read_at(x, x_off)
            .read(&w.buf)
            .write_at(y, y_off)
            .u32(n_rows)
            .u32(w.len)
            .f32(eps);
        let cfg = block_per_row(n_rows as usize, w.len as usize);
        self.launch_cfg(KernelId::RmsNorm, cfg, args)
    }

    /// `y[n x m] = x[n x k] * w^T`, x read from element `x_off`.
    pub fn mul_mat(
        &self,
        w: &Matrix,
        x: &DeviceBuffer<f32>,
        x_off: usize,
        y: &DeviceBuffer<f32>,
        n: u32,
    ) -> Result<()> {
        let args = Args::new()
            .read(&w.buf)
            .read_at(x, x_off)
            .write(y)
            .u32(w.ty.id())
            .u32(w.m)
            .u32(w.k)
            .u32(n);
        let tiles = (n as usize).div_ceil(MM_TOKENS_PER_TILE);
        let float = matches!(w.ty, QuantType::F32 | QuantType::F16 | QuantType::BF16);
        let cfg = if float && n <= MV_FLOAT_MAX_TOKENS {
            mv_float_blocks(w.m, n)
        } else if n == 1 {
            mv_blocks(w.m, 1, 8)
        } else {
            mm_blocks(w.m, tiles, tiles == 1)
        };
        self.launch_cfg(KernelId::MulMat, cfg, args)
    }

    pub fn add(
        &self,
        a: &DeviceBuffer<f32>,
        b: &DeviceBuffer<f32>,
        y: &DeviceBuffer<f32>,
        n: u32,
    ) -> Result<()> {
        let args = Args::new().read(a).read(b).write(y).u32(n);
        self.launch(KernelId::Add, n as usize, args)
    }

    pub fn add_rows(&self, x: &DeviceBuffer<f32>, b: &Vector, n_rows: u32) -> Result<()> {
        let args = Args::new()
            .read_write(x)
            .read(&b.buf)
            .u32(n_rows)
            .u32(b.len);
        self.launch(KernelId::AddRows, (n_rows * b.len) as usize, args)
    }

    pub fn swiglu(
        &self,
        gate: &DeviceBuffer<f32>,
        up: &DeviceBuffer<f32>,
        y: &DeviceBuffer<f32>,
        n: u32,
    ) -> Result<()> {
        let args = Args::new().read(gate).read(up).write(y).u32(n);
        self.launch(KernelId::Swiglu, n as usize, args)
    }

    pub fn rope(
        &self,
        x: &DeviceBuffer<f32>,
        pos: &DeviceBuffer<i32>,
        n_tokens: u32,
        n_heads: u32,
        head_dim: u32,
        r: &Rope,
    ) -> Result<()> {
        let args = Args::new()
            .read_write(x)
            .read(pos)
            .u32(n_tokens)
            .u32(n_heads)
            .u32(head_dim)
            .u32(r.n_rot)
            .u32(r.mode as u32)
            .f32(r.freq_base)
            .f32(r.freq_scale)
            .f32(r.ext_factor)
            .f32(r.attn_factor)
            .f32(r.beta_fast)
            .f32(r.beta_slow)
            .u32(r.n_ctx_orig);
        self.launch(
            KernelId::Rope,
            (n_tokens * n_heads * head_dim) as usize,
            args,
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub fn kv_store(
        &self,
        k: &DeviceBuffer<f32>,
        v: &DeviceBuffer<f32>,
        pos: &DeviceBuffer<i32>,
        k_cache: DeviceSlice<'_, u16>,
        v_cache: DeviceSlice<'_, u16>,
        kv_dim: u32,
        n_tokens: u32,
        n_ctx: u32,
    ) -> Result<()> {
        let args = Args::new()
            .read(k)
            .read(v)
            .read(pos)
            .write_slice(k_cache)
            .write_slice(v_cache)
            .u32(kv_dim)
            .u32(n_tokens)
            .u32(n_ctx);
        self.launch(KernelId::KvStore, (n_tokens * kv_dim) as usize, args)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        q: &DeviceBuffer<f32>,
        pos: &DeviceBuffer<i32>,
        k_cache: DeviceSlice<'_, u16>,
        v_cache: DeviceSlice<'_, u16>,
        out: &DeviceBuffer<f32>,
        n_tokens: u32,
        n_head: u32,
        n_kv_head: u32,
        head_dim: u32,
        n_ctx: u32,
        scale: f32,
    ) -> Result<()> {
        let shape = (n_tokens, n_head, n_kv_head, head_dim, n_ctx);
        let caches = (k_cache, v_cache);
        self.attention_launches(
            KernelId::Attention,
            n_tokens,
            q,
            pos,
            caches,
            out,
            shape,
            scale,
        )
    }

    /// `kernel` (`attention`, `attention_rows` or `attention_q8`, the same arguments) over
    /// `n_tokens` rows in launches of at most `most` rows (a 256-thread block per token and
    /// query head), each reading and writing from its first row's offset; `shape` is
    /// (n_tokens, n_head, n_kv_head, head_dim, n_ctx).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attention_launches(
        &self,
        kernel: KernelId,
        most: u32,
        q: &DeviceBuffer<f32>,
        pos: &DeviceBuffer<i32>,
        caches: (DeviceSlice<'_, u16>, DeviceSlice<'_, u16>),
        out: &DeviceBuffer<f32>,
        shape: (u32, u32, u32, u32, u32),
        scale: f32,
    ) -> Result<()> {
        let (n_tokens, n_head, n_kv_head, head_dim, n_ctx) = shape;
        let row = (n_head * head_dim) as usize;
        let mut t0 = 0;
        while t0 < n_tokens {
            let n = (n_tokens - t0).min(most.max(1));
            let at = t0 as usize;
            let args = Args::new()
                .read_at(q, at * row)
                .read_at(pos, at)
                .read_slice(caches.0)
                .read_slice(caches.1)
                .write_at(out, at * row)
                .u32(n)
                .u32(n_head)
                .u32(n_kv_head)
                .u32(head_dim)
                .u32(n_ctx)
                .f32(scale);
            self.launch_cfg(kernel, blocks((n * n_head) as usize), args)?;
            t0 += n;
        }
        Ok(())
    }

    /// [`Ops::attention`] with every row computed in the one-token summation order of
    /// decode (speculative decoding's verify windows): `attention_rows` launches of up to
    /// ATTENTION_ROWS_MAX_TOKENS rows where the device has it (the CPU backend: the window's
    /// rows share each K/V row read; CUDA: its attention), otherwise `n_tokens` one-token
    /// launches.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_per_row(
        &self,
        q: &DeviceBuffer<f32>,
        pos: &DeviceBuffer<i32>,
        k_cache: DeviceSlice<'_, u16>,
        v_cache: DeviceSlice<'_, u16>,
        out: &DeviceBuffer<f32>,
        n_tokens: u32,
        n_head: u32,
        n_kv_head: u32,
        head_dim: u32,
        n_ctx: u32,
        scale: f32,
    ) -> Result<()> {
        // Launches of up to ATTENTION_ROWS_MAX_TOKENS rows where the device has
        // attention_rows, else of one.
        let (kernel, most) = if n_tokens > 1 && self.dev.supports(KernelId::AttentionRows) {
            (KernelId::AttentionRows, ATTENTION_ROWS_MAX_TOKENS)
        } else {
            (KernelId::Attention, 1)
        };
        let shape = (n_tokens, n_head, n_kv_head, head_dim, n_ctx);
        let caches = (k_cache, v_cache);
        self.attention_launches(kernel, most, q, pos, caches, out, shape, scale)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn router_topk(
        &self,
        logits: &DeviceBuffer<f32>,
        ids: &DeviceBuffer<i32>,
        weights: &DeviceBuffer<f32>,
        n_tokens: u32,
        n_expert: u32,
        k: u32,
        norm: bool,
    ) -> Result<()> {
        let args = Args::new()
            .read(logits)
            .write(ids)
            .write(weights)
            .u32(n_tokens)
            .u32(n_expert)
            .u32(k)
            .u32(norm as u32);
        self.launch_cfg(KernelId::RouterTopk, warp_per_row(n_tokens as usize), args)
    }

    /// `ids[r]` = the arg-max of row r of `x` (`n_rows` rows of `n_cols`), each row in
    /// `argmax_split(n_cols)` pieces of one 256-thread block; `keys` holds that many u64 a
    /// row, `done` a ticket a row (0 between launches).
    #[allow(clippy::too_many_arguments)]
    pub fn argmax_rows(
        &self,
        x: &DeviceBuffer<f32>,
        ids: &DeviceBuffer<u32>,
        keys: &DeviceBuffer<u64>,
        done: &DeviceBuffer<u32>,
        n_rows: u32,
        n_cols: u32,
    ) -> Result<()> {
        let split = argmax_split(n_cols);
        let args = Args::new()
            .read(x)
            .write(ids)
            .read_write(keys)
            .read_write(done)
            .u32(n_rows)
            .u32(n_cols)
            .u32(split);
        self.launch_cfg(
            KernelId::ArgmaxRows,
            blocks(n_rows as usize * split as usize),
            args,
        )
    }

    /// `y[t][j] = x' * W_{ids[t][j]}^T`; x' is x[t] or, with `x_per_slot`, x[t][j]. `buf`
    /// holds all of `w`'s experts (`w.buf`, or a copy on another device).
    #[allow(clippy::too_many_arguments)]
    pub fn mul_mat_experts(
        &self,
        w: &Experts,
        buf: &DeviceBuffer<u8>,
        x: &DeviceBuffer<f32>,
        ids: &DeviceBuffer<i32>,
        y: &DeviceBuffer<f32>,
        n_tokens: u32,
        n_used: u32,
        x_per_slot: bool,
    ) -> Result<()> {
        let args = Args::new()
            .read(buf)
            .read(x)
            .read(ids)
            .write(y)
            .u32(w.ty.id())
            .u32(w.m)
            .u32(w.k)
            .u32(n_tokens)
            .u32(n_used)
            .u32(x_per_slot as u32)
            .u64(w.expert_bytes);
        let slots = (n_tokens * n_used) as usize;
        // A few tokens: a unit per (token, slot) and row group. More: a unit per routed
        // expert and row group (plus one for invalid ids), its tokens in tiles, so each
        // expert's weights are read once per tile instead of once per token.
        let cfg = if n_tokens <= EXPERT_GROUPING_MIN_TOKENS {
            mv_blocks(w.m, slots, 8)
        } else {
            mm_blocks(w.m, slots.min(w.n_expert as usize) + 1, false)
        };
        self.launch_cfg(KernelId::MulMatExperts, cfg, args)
    }

    /// [`Ops::mul_mat_experts`] over the expert cache: the pairs whose expert has a slot
    /// in `table` (the layer's row of the residency table) read `w` from `slots` at
    /// `matrix_offset` within the slot; the other pairs' rows of `y` are left alone.
    #[allow(clippy::too_many_arguments)]
    pub fn mul_mat_experts_cached(
        &self,
        w: &Experts,
        slots: &DeviceBuffer<u8>,
        slot_bytes: u64,
        matrix_offset: u64,
        table: &DeviceBuffer<i32>,
        table_offset: usize,
        x: &DeviceBuffer<f32>,
        ids: &DeviceBuffer<i32>,
        y: &DeviceBuffer<f32>,
        n_tokens: u32,
        n_used: u32,
        x_per_slot: bool,
    ) -> Result<()> {
        let args = Args::new()
            .read(slots)
            .read_at(table, table_offset)
            .read(x)
            .read(ids)
            .write(y)
            .u32(w.ty.id())
            .u32(w.m)
            .u32(w.k)
            .u32(n_tokens)
            .u32(n_used)
            .u32(x_per_slot as u32)
            .u32(w.n_expert)
            .u64(slot_bytes)
            .u64(matrix_offset);
        // One token per unit: matvec.cuh's 256-thread units of 16 rows.
        let units = (n_tokens * n_used) as usize * (w.m as usize).div_ceil(MM_ROWS_PER_BLOCK);
        self.launch_cfg(KernelId::MulMatExpertsCached, blocks(units), args)
    }

    /// [`Ops::moe_combine`] with the rows `host_row` names taken from `y_host` (the CPU
    /// pool's outputs) instead of `y`.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_combine_split(
        &self,
        y: &DeviceBuffer<f32>,
        y_host: &DeviceBuffer<f32>,
        host_row: &DeviceBuffer<i32>,
        weights: &DeviceBuffer<f32>,
        out: &DeviceBuffer<f32>,
        n_tokens: u32,
        n_used: u32,
        m: u32,
    ) -> Result<()> {
        let args = Args::new()
            .read(y)
            .read(y_host)
            .read(host_row)
            .read(weights)
            .write(out)
            .u32(n_tokens)
            .u32(n_used)
            .u32(m);
        self.launch(KernelId::MoeCombineSplit, (n_tokens * m) as usize, args)
    }

    pub fn moe_combine(
        &self,
        y: &DeviceBuffer<f32>,
        weights: &DeviceBuffer<f32>,
        out: &DeviceBuffer<f32>,
        n_tokens: u32,
        n_used: u32,
        m: u32,
    ) -> Result<()> {
        let args = Args::new()
            .read(y)
            .read(weights)
            .write(out)
            .u32(n_tokens)
            .u32(n_used)
            .u32(m);
        self.launch(KernelId::MoeCombine, (n_tokens * m) as usize, args)
    }

    pub fn sigmoid_gate_add(
        &self,
        x: &DeviceBuffer<f32>,
        gate: &DeviceBuffer<f32>,
        out: &DeviceBuffer<f32>,
        n_tokens: u32,
        m: u32,
    ) -> Result<()> {
        let args = Args::new()
            .read(x)
            .read(gate)
            .read_write(out)
            .u32(n_tokens)
            .u32(m);
        self.launch(KernelId::SigmoidGateAdd, (n_tokens * m) as usize, args)
    }
}

/// The fused forms (module `fused` of crates/core/kernels.txt): a GPU capability; the
/// forward pass runs the op sequences where the device lacks them.
impl Ops<'_> {
    /// Whether the device has every fused form.
    pub fn has_fused(&self) -> bool {
        [
            KernelId::AddRmsNorm,
            KernelId::CombineAddRmsNorm,
            KernelId::QkNormRopeStore,
            KernelId::ExpertsGateUp,
        ]
        .into_iter()
        .all(|k| self.dev.supports(k))
    }

    /// `sum = a + b; y = rmsnorm(sum) * w` for `n_rows` rows of `w.len`.
    #[allow(clippy::too_many_arguments)]
    pub fn add_rms_norm(
        &self,
        a: &DeviceBuffer<f32>,
        b: &DeviceBuffer<f32>,
        sum: &DeviceBuffer<f32>,
        w: &Vector,
        y: &DeviceBuffer<f32>,
        n_rows: u32,
        eps: f32,
    ) -> Result<()> {
        let args = Args::new()
            .read(a)
            .read(b)
            .write(sum)
            .read(&w.buf)
            .write(y)
            .u32(n_rows)
            .u32(w.len)
            .f32(eps);
        // rms_norm's shape, so the norms are bit for bit rms_norm's.
        let cfg = block_per_row(n_rows as usize, w.len as usize);
        self.launch_cfg(KernelId::AddRmsNorm, cfg, args)
    }

    /// `sum[t] = res[t] + Σ_j weights[t][j] ys[t][j]; y = rmsnorm(sum) * w`.
    #[allow(clippy::too_many_arguments)]
    pub fn combine_add_rms_norm(
        &self,
        ys: &DeviceBuffer<f32>,
        weights: &DeviceBuffer<f32>,
        res: &DeviceBuffer<f32>,
        sum: &DeviceBuffer<f32>,
        w: &Vector,
        y: &DeviceBuffer<f32>,
        n_tokens: u32,
        n_used: u32,
        eps: f32,
    ) -> Result<()> {
        let args = Args::new()
            .read(ys)
            .read(weights)
            .read(res)
            .write(sum)
            .read(&w.buf)
            .write(y)
            .u32(n_tokens)
            .u32(n_used)
            .u32(w.len)
            .f32(eps);
        let cfg = block_per_row(n_tokens as usize, w.len as usize);
        self.launch_cfg(KernelId::CombineAddRmsNorm, cfg, args)
    }

    /// Per head: optional rms_norm (`norm`: the q and k norm weights), rope, then q into
    /// `q_out` and k, v into the caches at `pos`.
    #[allow(clippy::too_many_arguments)]
    pub fn qk_norm_rope_store(
        &self,
        q: &DeviceBuffer<f32>,
        k: &DeviceBuffer<f32>,
        v: &DeviceBuffer<f32>,
        norm: Option<(&Vector, &Vector)>,
        pos: &DeviceBuffer<i32>,
        q_out: &DeviceBuffer<f32>,
        caches: (DeviceSlice<'_, u16>, DeviceSlice<'_, u16>),
        shape: QkvShape,
        eps: f32,
        r: &Rope,
    ) -> Result<()> {
        // Without norms the weight arguments are not read; any f32 buffer stands in.
        let (qn, kn) = match norm {
            Some((qn, kn)) => (&qn.buf, &kn.buf),
            None => (q, k),
        };
        let args = Args::new()
            .read(q)
            .read(k)
            .read(v)
            .read(qn)
            .read(kn)
            .read(pos)
            .write(q_out)
            .write_slice(caches.0)
            .write_slice(caches.1);
        let args = head_rope_args(args, &shape, norm.is_some(), eps, r);
        // One warp per (token, head): q, k and v heads.
        let heads = shape.n_tokens as usize * (shape.n_head + 2 * shape.n_kv_head) as usize;
        self.launch_cfg(KernelId::QkNormRopeStore, warp_per_row(heads), args)
    }

    /// `y[t][j] = swiglu(x[t] * Wg_e^T, x[t] * Wu_e^T)`, `e = ids[t][j]`; `gate` and `up` of
    /// one quantised type.
    #[allow(clippy::too_many_arguments)]
    pub fn experts_gate_up(
        &self,
        gate: (&Experts, &DeviceBuffer<u8>),
        up: (&Experts, &DeviceBuffer<u8>),
        x: &DeviceBuffer<f32>,
        ids: &DeviceBuffer<i32>,
        y: &DeviceBuffer<f32>,
        n_tokens: u32,
        n_used: u32,
    ) -> Result<()> {
        let (g, wg) = gate;
        let (u, wu) = up;
        let args = Args::new()
            .read(wg)
            .read(wu)
            .read(x)
            .read(ids)
            .write(y)
            .u32(g.ty.id())
            .u32(g.m)
            .u32(g.k)
            .u32(n_tokens)
            .u32(n_used)
            .u64(g.expert_bytes)
            .u64(u.expert_bytes);
        let slots = (n_tokens * n_used) as usize;
        self.launch_cfg(KernelId::ExpertsGateUp, mv_blocks(g.m, slots, 4), args)
    }
}

/// The attention shape [`Ops::qk_norm_rope_store`] works on.
#[derive(Clone, Copy, Debug)]
pub struct QkvShape {
    pub n_tokens: u32,
    pub n_head: u32,
    pub n_kv_head: u32,
    pub head_dim: u32,
    pub n_ctx: u32,
}
