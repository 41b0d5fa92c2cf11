//! One-token launches that replace several of a decode step's (module `fused` of
//! crates/core/kernels.txt, a GPU capability): each computes bit for bit what the ops it
//! replaces compute, so the forward pass takes them where the device has them and runs
//! the separate ops elsewhere (the CPU backend).

use strata_core::{Args, DeviceBuffer, DeviceSlice, KernelId, LaunchCfg, Result};
use strata_gguf::QuantType;
use strata_quant::ActFormat;

use crate::hparams::Rope;
use crate::ops::{Ops, QkvShape, row_block_threads};
use crate::weights::{Experts, Matrix, Vector};

/// A launch of `units` matvec units of `m` rows each in blocks of `threads` (a unit is
/// 2 rows a warp, up to 8 warps: kernels-cuda/matvec.cuh's mv_rows_per_unit).
fn norm_product_cfg(m: u32, units_per_row_group: usize, threads: u32) -> LaunchCfg {
    let rows = ((threads / 32).min(8) * 2) as usize;
    let blocks = (m as usize).div_ceil(rows) * units_per_row_group.max(1);
    LaunchCfg::linear(blocks * threads as usize, threads)
}

/// Most rows of a verify window whose Q, K and V take one launch (the CUDA backend's
/// mul_mat_qkv_q8_rows: kernels-cuda/matvec_q8.cuh MVQ_TOKENS).
pub const QKV_WINDOW_MAX_TOKENS: u32 = 8;

/// Weight rows of one matvec unit in a 128-thread block (kernels-cuda/matvec.cuh: 4 warps
/// of MV_ROWS = 2 rows).
const MV_UNIT_ROWS: usize = 8;

/// Most tokens of a verify window whose routed experts' gate, up and SwiGLU take one
/// launch (the CUDA backend's window forms group a window's pairs by expert:
/// kernels-cuda/matvec_window.cuh MVW_TOKENS, MVW_PAIRS pairs at most).
pub const GATE_UP_WINDOW_MAX_TOKENS: u32 = 8;
/// Most (token, routed expert) pairs those window forms group.
const GATE_UP_WINDOW_MAX_PAIRS: u32 = 64;

impl Ops<'_> {
    /// Whether the device computes Q, K and V of one activation in one launch.
    pub fn has_mul_mat_qkv(&self) -> bool {
        self.dev.supports(KernelId::MulMatQkv)
    }

    /// Whether Q, K and V of `n` rows take one [`Ops::mul_mat_qkv`] launch: a decode step
    /// where the device has it, or a verify window of up to [`QKV_WINDOW_MAX_TOKENS`] rows
    /// whose three formats quantise the activation alike (the CUDA backend's window form
    /// quantises the rows once for all three and reads each weight row once for all of
    /// them; other formats would run the kernel's per-token units). Every row is bit for
    /// bit what three [`Ops::mul_mat`] give.
    pub fn qkv_in_one_launch(&self, w: (&Matrix, &Matrix, &Matrix), n: u32) -> bool {
        let (wq, wk, wv) = w;
        let same_k = wq.k == wk.k && wq.k == wv.k;
        let act = |ty: QuantType| strata_quant::kernels(ty).map(|k| k.act);
        let window = (2..=QKV_WINDOW_MAX_TOKENS).contains(&n)
            && matches!(
                act(wq.ty),
                Some(ActFormat::Q8_0 | ActFormat::Q8_1 | ActFormat::Q8_K)
            )
            && act(wk.ty) == act(wq.ty)
            && act(wv.ty) == act(wq.ty);
        same_k && (n == 1 || window) && self.has_mul_mat_qkv()
    }

    /// Whether a launch of `n` tokens of `n_used` routed experts each takes the fused gate
    /// and up forms: a decode step, or a verify window whose pairs the CUDA backend's
    /// window forms group by expert (more would run the kernels' per-pair units, slower
    /// than the grouped separate products).
    pub fn gate_up_in_one_launch(&self, n: u32, n_used: u32) -> bool {
        n <= 2
            || (n <= GATE_UP_WINDOW_MAX_TOKENS
                && n.checked_mul(n_used)
                    .is_some_and(|p| p <= GATE_UP_WINDOW_MAX_PAIRS))
    }

    /// Whether the device computes the cached experts' gate, up and SwiGLU in one launch
    /// ([`Ops::experts_gate_up_cached`]).
    pub fn has_experts_gate_up_cached(&self) -> bool {
        self.dev.supports(KernelId::ExpertsGateUpCached)
    }

    /// [`Ops::experts_gate_up`] over the expert cache: the pairs whose expert has a slot in
    /// `table` (the layer's row of the residency table, from `table_offset`) read the gate
    /// at `offsets.0` and the up matrix at `offsets.1` within the slot; the other pairs'
    /// rows of `y` are left alone. Bit for bit [`Ops::mul_mat_experts_cached`] of each and
    /// [`Ops::swiglu`].
    #[allow(clippy::too_many_arguments)]
    pub fn experts_gate_up_cached(
        &self,
        gate: &Experts,
        slots: &DeviceBuffer<u8>,
        slot_bytes: u64,
        offsets: (u64, u64),
        table: &DeviceBuffer<i32>,
        table_offset: usize,
        x: &DeviceBuffer<f32>,
        ids: &DeviceBuffer<i32>,
        y: &DeviceBuffer<f32>,
        n_tokens: u32,
        n_used: u32,
    ) -> Result<()> {
        let args = Args::new()
            .read(slots)
            .read_at(table, table_offset)
            .read(x)
            .read(ids)
            .write(y)
            .u32(gate.ty.id())
            .u32(gate.m)
            .u32(gate.k)
            .u32(n_tokens)
            .u32(n_used)
            .u32(gate.n_expert)
            .u64(slot_bytes)
            .u64(offsets.0)
            .u64(offsets.1);
        // One token per unit: 4-warp blocks of a gate and an up row a warp, as
        // experts_gate_up's.
        let slots_n = (n_tokens * n_used) as usize;
        let rows = MV_UNIT_ROWS / 2;
        let blocks = (gate.m as usize).div_ceil(rows) * slots_n.max(1);
        let cfg = LaunchCfg::linear(blocks * 128, 128);
        self.launch_cfg(KernelId::ExpertsGateUpCached, cfg, args)
    }

    /// Whether the device computes Q, K and V and then their per-head norms, rope and K/V
    /// append in one launch.
    pub fn has_mul_mat_qkv_rope(&self) -> bool {
        self.dev.supports(KernelId::MulMatQkvRope)
    }

    /// Whether the device computes the router's logits and their top-k in one launch.
    pub fn has_router_matvec_topk(&self) -> bool {
        self.dev.supports(KernelId::RouterMatvecTopk)
    }

    /// Whether the device runs an output projection with the residual add and norm after
    /// it, and a MoE down projection with the combine, add and norm after it, in one launch
    /// each.
    pub fn has_products_with_norm(&self) -> bool {
        self.dev.supports(KernelId::MulMatAddRmsNorm)
            && self.dev.supports(KernelId::ExpertsDownNorm)
    }

    /// `q = x * wq^T`, `k = x * wk^T`, `v = x * wv^T` for `n` rows of `x` (every matrix
    /// `wq.k` wide) in one launch: [`Ops::mul_mat`] three times.
    pub fn mul_mat_qkv(
        &self,
        w: (&Matrix, &Matrix, &Matrix),
        x: &DeviceBuffer<f32>,
        y: (&DeviceBuffer<f32>, &DeviceBuffer<f32>, &DeviceBuffer<f32>),
        n: u32,
    ) -> Result<()> {
        let (wq, wk, wv) = w;
        let (q, k, v) = y;
        let args = Args::new()
            .read(&wq.buf)
            .read(&wk.buf)
            .read(&wv.buf)
            .read(x)
            .write(q)
            .write(k)
            .write(v)
            .u32(wq.ty.id())
            .u32(wk.ty.id())
            .u32(wv.ty.id())
            .u32(wq.m)
            .u32(wk.m)
            .u32(wv.m)
            .u32(wq.k)
            .u32(n);
        // One unit (8 rows of one matrix for one token) per 128-thread block: a decode
        // step's 4,096 + 512 + 512 rows are 640 blocks.
        let units: usize = [wq.m, wk.m, wv.m]
            .iter()
            .map(|&m| (m as usize).div_ceil(MV_UNIT_ROWS))
            .sum();
        let cfg = LaunchCfg::linear(units * n.max(1) as usize * 128, 128);
        self.launch_cfg(KernelId::MulMatQkv, cfg, args)
    }

    /// `logits = x * router^T` for `n_tokens` rows of `x`, then [`Ops::router_topk`] of
    /// them, in one launch. `done` is the kernel's block counter: one u32, 0 before the
    /// first launch (the kernel leaves it at 0).
    #[allow(clippy::too_many_arguments)]
    pub fn router_matvec_topk(
        &self,
        router: &Matrix,
        x: &DeviceBuffer<f32>,
        logits: &DeviceBuffer<f32>,
        ids: &DeviceBuffer<i32>,
        weights: &DeviceBuffer<f32>,
        done: &DeviceBuffer<u32>,
        n_tokens: u32,
        top_k: u32,
        norm: bool,
    ) -> Result<()> {
        let args = Args::new()
            .read(&router.buf)
            .read(x)
            .write(logits)
            .write(ids)
            .write(weights)
            .read_write(done)
            .u32(router.ty.id())
            .u32(router.m)
            .u32(router.k)
            .u32(n_tokens)
            .u32(top_k)
            .u32(norm as u32);
        // mul_mat's one-token shapes (Ops::mul_mat) for each token: float weights in
        // one-warp blocks of 2 rows, quantised ones in 128-thread blocks of 8.
        let float = matches!(router.ty, QuantType::F32 | QuantType::F16 | QuantType::BF16);
        let (rows, threads) = if float { (2, 32) } else { (MV_UNIT_ROWS, 128) };
        let blocks = (router.m as usize).div_ceil(rows) * n_tokens.max(1) as usize;
        let cfg = LaunchCfg::linear(blocks * threads as usize, threads);
        self.launch_cfg(KernelId::RouterMatvecTopk, cfg, args)
    }

    /// `y0 = x * w^T` for `n` rows, then [`Ops::add_rms_norm`]`(a, y0, sum, norm, y)`, in
    /// one launch; `done` as for [`Ops::router_matvec_topk`].
    #[allow(clippy::too_many_arguments)]
    pub fn mul_mat_add_rms_norm(
        &self,
        w: &Matrix,
        x: &DeviceBuffer<f32>,
        y0: &DeviceBuffer<f32>,
        a: &DeviceBuffer<f32>,
        sum: &DeviceBuffer<f32>,
        norm: (&Vector, f32),
        y: &DeviceBuffer<f32>,
        done: &DeviceBuffer<u32>,
        n: u32,
    ) -> Result<()> {
        let (nw, eps) = norm;
        let args = Args::new()
            .read(&w.buf)
            .read(x)
            .write(y0)
            .read(a)
            .write(sum)
            .read(&nw.buf)
            .write(y)
            .read_write(done)
            .u32(w.ty.id())
            .u32(w.m)
            .u32(w.k)
            .u32(n)
            .f32(eps);
        let cfg = norm_product_cfg(w.m, n as usize, row_block_threads(w.m));
        self.launch_cfg(KernelId::MulMatAddRmsNorm, cfg, args)
    }

    /// The down projection of each (token, slot) (`x` per slot, `ys` out), then
    /// [`Ops::combine_add_rms_norm`]`(ys, weights, res, sum, norm, y)`, in one launch;
    /// `done` as for [`Ops::router_matvec_topk`].
    #[allow(clippy::too_many_arguments)]
    pub fn experts_down_norm(
        &self,
        down: (&Experts, &DeviceBuffer<u8>),
        x: &DeviceBuffer<f32>,
        ids: &DeviceBuffer<i32>,
        ys: &DeviceBuffer<f32>,
        weights: &DeviceBuffer<f32>,
        res: &DeviceBuffer<f32>,
        sum: &DeviceBuffer<f32>,
        norm: (&Vector, f32),
        y: &DeviceBuffer<f32>,
        done: &DeviceBuffer<u32>,
        n_tokens: u32,
        n_used: u32,
    ) -> Result<()> {
        let (w, buf) = down;
        let (nw, eps) = norm;
        let args = Args::new()
            .read(buf)
            .read(x)
            .read(ids)
            .write(ys)
            .read(weights)
            .read(res)
            .write(sum)
            .read(&nw.buf)
            .write(y)
            .read_write(done)
            .u32(w.ty.id())
            .u32(w.m)
            .u32(w.k)
            .u32(n_tokens)
            .u32(n_used)
            .u64(w.expert_bytes)
            .f32(eps);
        let slots = (n_tokens * n_used) as usize;
        let cfg = norm_product_cfg(w.m, slots, row_block_threads(w.m));
        self.launch_cfg(KernelId::ExpertsDownNorm, cfg, args)
    }

    /// [`Ops::mul_mat_qkv`] (q, k, v: `y`), then [`Ops::qk_norm_rope_store`] of them into
    /// `q_out` and the caches, in one launch. `done` holds one u32 counter per (token,
    /// head), all 0 (the kernel leaves them at 0).
    #[allow(clippy::too_many_arguments)]
    pub fn mul_mat_qkv_rope(
        &self,
        w: (&Matrix, &Matrix, &Matrix),
        x: &DeviceBuffer<f32>,
        y: (&DeviceBuffer<f32>, &DeviceBuffer<f32>, &DeviceBuffer<f32>),
        norm: Option<(&Vector, &Vector)>,
        pos: &DeviceBuffer<i32>,
        q_out: &DeviceBuffer<f32>,
        caches: (DeviceSlice<'_, u16>, DeviceSlice<'_, u16>),
        done: &DeviceBuffer<u32>,
        shape: QkvShape,
        eps: f32,
        r: &Rope,
    ) -> Result<()> {
        let (wq, wk, wv) = w;
        let (q, k, v) = y;
        // Without norms the weight arguments are not read; any f32 buffer stands in.
        let (qn, kn) = match norm {
            Some((qn, kn)) => (&qn.buf, &kn.buf),
            None => (q, k),
        };
        let args = Args::new()
            .read(&wq.buf)
            .read(&wk.buf)
            .read(&wv.buf)
            .read(x)
            .write(q)
            .write(k)
            .write(v)
            .read(qn)
            .read(kn)
            .read(pos)
            .write(q_out)
            .write_slice(caches.0)
            .write_slice(caches.1)
            .read_write(done)
            .u32(wq.ty.id())
            .u32(wk.ty.id())
            .u32(wv.ty.id())
            .u32(wq.k);
        let args = crate::ops::head_rope_args(args, &shape, norm.is_some(), eps, r);
        // mul_mat_qkv's shape: a unit of 8 rows per 128-thread block.
        let units: usize = [wq.m, wk.m, wv.m]
            .iter()
            .map(|&m| (m as usize).div_ceil(MV_UNIT_ROWS))
            .sum();
        let cfg = LaunchCfg::linear(units * shape.n_tokens.max(1) as usize * 128, 128);
        self.launch_cfg(KernelId::MulMatQkvRope, cfg, args)
    }
}
