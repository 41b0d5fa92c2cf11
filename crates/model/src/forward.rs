//! The forward pass: one batch of tokens through every layer, as launches on one stream.
//! Scratch buffers are sized once for the largest batch and reused.

use strata_core::{Device, DeviceBuffer, KernelId, Stream, argmax_split};

use crate::error::{ModelError, Result};
use crate::hparams::QkNorm;
pub use crate::kv::KvCache;
use crate::kv::KvFormat;
use crate::model::{Attention, Ffn, Model};
use crate::moe::{MoeIo, RoutedExperts};
use crate::ops::{Ops, QkvShape};
use crate::weights::Vector;

/// Activations for up to `n_max` tokens at once.
pub struct Scratch {
    pub n_max: u32,
    ids: DeviceBuffer<u32>,
    pos: DeviceBuffer<i32>,
    x: DeviceBuffer<f32>,
    x2: DeviceBuffer<f32>,
    xn: DeviceBuffer<f32>,
    q: DeviceBuffer<f32>,
    k: DeviceBuffer<f32>,
    v: DeviceBuffer<f32>,
    qn: DeviceBuffer<f32>,
    kn: DeviceBuffer<f32>,
    att: DeviceBuffer<f32>,
    tmp: DeviceBuffer<f32>,
    fa: DeviceBuffer<f32>,
    fb: DeviceBuffer<f32>,
    fc: DeviceBuffer<f32>,
    router: DeviceBuffer<f32>,
    expert_ids: DeviceBuffer<i32>,
    expert_w: DeviceBuffer<f32>,
    moe_y: DeviceBuffer<f32>,
    shared: DeviceBuffer<f32>,
    gate_logit: DeviceBuffer<f32>,
    /// The block counters of router_matvec_topk and of the products that end in a norm
    /// (0 between launches; one launch at a time on the forward pass's stream).
    router_done: DeviceBuffer<u32>,
    norm_done: DeviceBuffer<u32>,
    /// mul_mat_qkv_rope's counters, one per (token, head) of a one-token step.
    head_done: DeviceBuffer<u32>,
    /// Logits of up to `logit_rows` rows (1 unless every row's logits are wanted: a
    /// vocabulary-wide row per batch token would dwarf a small model).
    pub logits: DeviceBuffer<f32>,
    pub logit_rows: u32,
    /// Each logits row's arg-max, where [`Model::record_argmax`] computes it: one token id
    /// per row of `logits`, so a greedy step downloads ids instead of rows.
    pub argmax: DeviceBuffer<u32>,
    /// argmax_rows' per-piece keys and per-row tickets (0 between launches).
    argmax_keys: DeviceBuffer<u64>,
    argmax_done: DeviceBuffer<u32>,
}

impl Scratch {
    /// Scratch for batches of up to `n_max` tokens, with logits for `logit_rows` of them.
    pub fn new(dev: &Device, model: &Model, n_max: u32, logit_rows: u32) -> Result<Self> {
        let h = &model.hp;
        let n = n_max.max(1) as usize;
        let (e, qd, kvd) = (h.n_embd as usize, h.q_dim() as usize, h.kv_dim() as usize);
        let (mut ff, mut experts, mut used) = (h.n_ff as usize, 1usize, 1usize);
        if let Some(m) = &h.moe {
            experts = m.n_expert as usize;
            used = m.n_expert_used as usize;
            ff = ff
                .max(used * m.n_ff_exp as usize)
                .max(m.n_ff_shared.unwrap_or(0) as usize);
        }
        let f = |len: usize| dev.alloc::<f32>(len.max(1));
        let heads = (h.n_head + 2 * h.n_head_kv) as usize;
        let logit_rows = logit_rows.clamp(1, n as u32);
        let split = argmax_split(h.n_vocab) as usize;
        Ok(Scratch {
            n_max: n as u32,
            ids: dev.alloc::<u32>(n)?,
            pos: dev.alloc::<i32>(n)?,
            x: f(n * e)?,
            x2: f(n * e)?,
            xn: f(n * e)?,
            q: f(n * qd)?,
            k: f(n * kvd)?,
            v: f(n * kvd)?,
            qn: f(n * qd)?,
            kn: f(n * kvd)?,
            att: f(n * qd)?,
            tmp: f(n * e)?,
            fa: f(n * ff)?,
            fb: f(n * ff)?,
            fc: f(n * ff)?,
            router: f(n * experts)?,
            expert_ids: dev.alloc::<i32>(n * used)?,
            expert_w: f(n * used)?,
            moe_y: f(n * used * e)?,
            shared: f(n * e)?,
            gate_logit: f(n)?,
            router_done: dev.alloc_from(&[0u32], dev.main_stream())?,
            norm_done: dev.alloc_from(&[0u32], dev.main_stream())?,
            head_done: dev.alloc_from(&vec![0u32; heads], dev.main_stream())?,
            logits: f(logit_rows as usize * h.n_vocab as usize)?,
            logit_rows,
            argmax: dev.alloc::<u32>(logit_rows as usize)?,
            argmax_keys: dev.alloc::<u64>(logit_rows as usize * split)?,
            argmax_done: dev.alloc_from(&vec![0u32; logit_rows as usize], dev.main_stream())?,
        })
    }
}

/// Which rows' logits a forward pass computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitRows {
    Last,
    All,
    /// Every row's logits, each row's attention launched as a one-token step launches it.
    /// For speculative decoding's verify windows: a CPU attention launch of 2+ tokens sums
    /// in llama.cpp's batch order, which can differ from a one-token step in the last bits
    /// and flip a greedy token; one launch per row keeps every row equal to decode.
    AllAsDecode,
}

impl Model {
    /// Runs `tokens` (at most `scratch.n_max`) at positions `pos0..`, writing their K/V
    /// into `kv` and the requested logits into `scratch.logits` (row 0 for `Last`).
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        dev: &Device,
        stream: Stream,
        scratch: &Scratch,
        kv: &KvCache,
        tokens: &[u32],
        pos0: u32,
        rows: LogitRows,
    ) -> Result<()> {
        self.forward_with(dev, stream, scratch, kv, tokens, pos0, rows, None)
    }

    /// [`Model::forward`], with the routed experts run by `experts` (an expert cache).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_with(
        &self,
        dev: &Device,
        stream: Stream,
        scratch: &Scratch,
        kv: &KvCache,
        tokens: &[u32],
        pos0: u32,
        rows: LogitRows,
        experts: Option<&mut dyn RoutedExperts>,
    ) -> Result<()> {
        self.prepare(dev, stream, scratch, kv, tokens, pos0)?;
        self.record_with(dev, stream, scratch, kv, tokens.len() as u32, rows, experts)
    }

    /// Checks a batch and uploads its token ids and positions into the scratch: what
    /// changes from one step to the next. [`Model::record`] then queues the launches,
    /// which read only device buffers, so a captured recording replays for any step.
    pub fn prepare(
        &self,
        dev: &Device,
        stream: Stream,
        scratch: &Scratch,
        kv: &KvCache,
        tokens: &[u32],
        pos0: u32,
    ) -> Result<()> {
        let h = &self.hp;
        let n = tokens.len() as u32;
        if n == 0 || n > scratch.n_max {
            return Err(ModelError::BadHParams(format!(
                "a forward pass takes 1..={} tokens, got {n}",
                scratch.n_max
            )));
        }
        let end = pos0 as usize + n as usize;
        if end > kv.n_ctx as usize {
            return Err(ModelError::ContextFull {
                needed: end,
                ctx: kv.n_ctx as usize,
            });
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t >= h.n_vocab) {
            return Err(ModelError::BadToken(bad, h.n_vocab as usize));
        }
        let positions: Vec<i32> = (0..n).map(|i| (pos0 + i) as i32).collect();
        dev.upload(&scratch.ids, tokens, stream)?;
        dev.upload(&scratch.pos, &positions, stream)?;
        Ok(())
    }

    /// Queues the forward pass of the `n` tokens [`Model::prepare`] uploaded: launches
    /// only, so it can run inside [`Device::capture`].
    pub fn record(
        &self,
        dev: &Device,
        stream: Stream,
        scratch: &Scratch,
        kv: &KvCache,
        n: u32,
        rows: LogitRows,
    ) -> Result<()> {
        self.record_with(dev, stream, scratch, kv, n, rows, None)
    }

    /// [`Model::record`], with the routed experts run by `experts`; with an expert cache
    /// this waits for the device at every MoE layer, so it cannot be captured.
    #[allow(clippy::too_many_arguments)]
    pub fn record_with(
        &self,
        dev: &Device,
        stream: Stream,
        scratch: &Scratch,
        kv: &KvCache,
        n: u32,
        rows: LogitRows,
        mut experts: Option<&mut dyn RoutedExperts>,
    ) -> Result<()> {
        let h = &self.hp;
        if n == 0 || n > scratch.n_max {
            return Err(ModelError::BadHParams(format!(
                "a forward pass takes 1..={} tokens, got {n}",
                scratch.n_max
            )));
        }
        let (first, count) = match rows {
            LogitRows::Last => (n - 1, 1),
            LogitRows::All | LogitRows::AllAsDecode => (0, n),
        };
        if count > scratch.logit_rows {
            return Err(ModelError::BadHParams(format!(
                "{count} rows of logits asked for, the scratch holds {}",
                scratch.logit_rows
            )));
        }
        let ops = Ops { dev, stream };
        let s = scratch;
        // With the fused forms each residual add carries the next norm (xn always holds
        // the normalised input of what comes next), so the layer's norm is not its own launch.
        let fused = ops.has_fused();
        ops.embed_rows(&self.tok_embd, &s.ids, &s.x, n)?;
        if fused && let Some(l0) = self.layers.first() {
            ops.rms_norm(&s.x, 0, &l0.attn.norm, &s.xn, 0, n, h.rms_eps)?;
        }
        for (il, layer) in self.layers.iter().enumerate() {
            // x -> x2 (attention residual) -> x (FFN residual)
            let per_row = rows == LogitRows::AllAsDecode;
            // Decode on a device that has the merged launches: the output projection adds
            // the residual and normalises (x2, xn), as does the down projection (x, xn).
            let merged = fused && n == 1 && ops.has_products_with_norm();
            let ffn_norm = merged.then_some(&layer.ffn_norm);
            let normed =
                self.attention(&ops, s, &layer.attn, kv, il, n, per_row, fused, ffn_norm)?;
            if fused && !normed {
                ops.add_rms_norm(&s.x, &s.tmp, &s.x2, &layer.ffn_norm, &s.xn, n, h.rms_eps)?;
            } else if !fused {
                ops.add(&s.x, &s.tmp, &s.x2, n * h.n_embd)?;
                ops.rms_norm(&s.x2, 0, &layer.ffn_norm, &s.xn, 0, n, h.rms_eps)?;
            }
            let next_norm = self
                .layers
                .get(il + 1)
                .map_or(&self.output_norm, |l| &l.attn.norm);
            let down_norm = merged.then_some(next_norm);
            let out = self.ffn(
                &ops,
                s,
                &layer.ffn,
                il,
                n,
                experts.as_deref_mut(),
                fused,
                down_norm,
            )?;
            if !fused {
                ops.add(&s.x2, &s.tmp, &s.x, n * h.n_embd)?;
                continue;
            }
            match out {
                FfnOut::Normed => {}
                FfnOut::Tmp => {
                    ops.add_rms_norm(&s.x2, &s.tmp, &s.x, next_norm, &s.xn, n, h.rms_eps)?
                }
                FfnOut::Slots { n_used } => ops.combine_add_rms_norm(
                    &s.moe_y,
                    &s.expert_w,
                    &s.x2,
                    &s.x,
                    next_norm,
                    &s.xn,
                    n,
                    n_used,
                    h.rms_eps,
                )?,
            }
        }
        let e = h.n_embd as usize;
        if fused && !self.layers.is_empty() {
            // The last layer's residual add normalised every row with the output norm.
            ops.mul_mat(self.output(), &s.xn, first as usize * e, &s.logits, count)?;
            return Ok(());
        }
        ops.rms_norm(
            &s.x,
            first as usize * e,
            &self.output_norm,
            &s.xn,
            0,
            count,
            h.rms_eps,
        )?;
        ops.mul_mat(self.output(), &s.xn, 0, &s.logits, count)?;
        Ok(())
    }

    /// Whether the device computes logits rows' arg-maxes ([`Model::record_argmax`]).
    pub fn has_device_argmax(dev: &Device) -> bool {
        dev.supports(KernelId::ArgmaxRows)
    }

    /// Queues the arg-max of the first `rows` rows of `scratch.logits` (the rows a forward
    /// pass just wrote: its last token's for `LogitRows::Last`) into `scratch.argmax`, by
    /// core's `argmax_row` rule. Launches only, so it is captured with [`Model::record`].
    pub fn record_argmax(
        &self,
        dev: &Device,
        stream: Stream,
        scratch: &Scratch,
        rows: u32,
    ) -> Result<()> {
        if rows == 0 || rows > scratch.logit_rows {
            return Err(ModelError::BadHParams(format!(
                "the arg-max of {rows} rows asked for, the scratch holds {}",
                scratch.logit_rows
            )));
        }
        let ops = Ops { dev, stream };
        let s = scratch;
        ops.argmax_rows(
            &s.logits,
            &s.argmax,
            &s.argmax_keys,
            &s.argmax_done,
            rows,
            self.hp.n_vocab,
        )?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        ops: &Ops<'_>,
        s: &Scratch,
        a: &Attention,
        kv: &KvCache,
        il: usize,
        n: u32,
        per_row: bool,
        fused: bool,
        ffn_norm: Option<&Vector>,
    ) -> Result<bool> {
        let h = &self.hp;
        if !fused {
            ops.rms_norm(&s.x, 0, &a.norm, &s.xn, 0, n, h.rms_eps)?;
        }
        // Per-head norms (or none), rope and the K/V append in one launch.
        let norms = match (h.qk_norm, &a.q_norm, &a.k_norm) {
            (QkNorm::None, _, _) | (_, None, _) | (_, _, None) => Some(None),
            (QkNorm::PerHead, Some(qn), Some(kn)) => Some(Some((qn, kn))),
            (QkNorm::Full, _, _) => None,
        };
        // The fused form appends f16 rows; an int8 cache quantises its own.
        let rope_fused = fused && h.head_dim <= 256 && kv.format == KvFormat::F16;
        let shape = QkvShape {
            n_tokens: n,
            n_head: h.n_head,
            n_kv_head: h.n_head_kv,
            head_dim: h.head_dim,
            n_ctx: kv.n_ctx,
        };
        let caches = kv.layer(il)?;
        // Decode: the three projections of one activation in one launch where the device
        // has it (the same rows bit for bit), with the per-head work in the same launch
        // where nothing comes between them (no biases).
        let same_k = a.wq.k == a.wk.k && a.wq.k == a.wv.k;
        let no_bias = a.bq.is_none() && a.bk.is_none() && a.bv.is_none();
        let qkv_shape = a.wq.m == h.q_dim() && a.wk.m == h.kv_dim() && a.wv.m == h.kv_dim();
        if let Some(norm) = norms
            && rope_fused
            && n == 1
            && same_k
            && no_bias
            && qkv_shape
            && ops.has_mul_mat_qkv_rope()
        {
            let (w, y) = ((&a.wq, &a.wk, &a.wv), (&s.q, &s.k, &s.v));
            let (pos, done) = (&s.pos, &s.head_done);
            let (eps, rope) = (h.rms_eps, &h.rope);
            ops.mul_mat_qkv_rope(
                w, &s.xn, y, norm, pos, &s.qn, caches, done, shape, eps, rope,
            )?;
            return self.attend(ops, s, a, kv, il, n, per_row, &s.qn, ffn_norm);
        }
        // A decode step, or a verify window's rows where one launch reads each weight row
        // once for all of them.
        if fused && ops.qkv_in_one_launch((&a.wq, &a.wk, &a.wv), n) {
            ops.mul_mat_qkv((&a.wq, &a.wk, &a.wv), &s.xn, (&s.q, &s.k, &s.v), n)?;
        } else {
            ops.mul_mat(&a.wq, &s.xn, 0, &s.q, n)?;
            ops.mul_mat(&a.wk, &s.xn, 0, &s.k, n)?;
            ops.mul_mat(&a.wv, &s.xn, 0, &s.v, n)?;
        }
        for (buf, bias) in [(&s.q, &a.bq), (&s.k, &a.bk), (&s.v, &a.bv)] {
            if let Some(b) = bias {
                ops.add_rows(buf, b, n)?;
            }
        }
        let q = match norms {
            Some(norm) if rope_fused => {
                ops.qk_norm_rope_store(
                    &s.q, &s.k, &s.v, norm, &s.pos, &s.qn, caches, shape, h.rms_eps, &h.rope,
                )?;
                &s.qn
            }
            _ => self.qk_norm_rope_store_ops(ops, s, a, kv, il, n)?,
        };
        self.attend(ops, s, a, kv, il, n, per_row, q, ffn_norm)
    }

    /// Q/K norms, rope and the K/V append as separate ops; the query buffer they leave.
    fn qk_norm_rope_store_ops<'s>(
        &self,
        ops: &Ops<'_>,
        s: &'s Scratch,
        a: &Attention,
        kv: &KvCache,
        il: usize,
        n: u32,
    ) -> Result<&'s DeviceBuffer<f32>> {
        let h = &self.hp;
        let (q, k) = match (h.qk_norm, &a.q_norm, &a.k_norm) {
            (QkNorm::None, _, _) | (_, None, _) | (_, _, None) => (&s.q, &s.k),
            (QkNorm::PerHead, Some(qn), Some(kn)) => {
                ops.rms_norm(&s.q, 0, qn, &s.qn, 0, n * h.n_head, h.rms_eps)?;
                ops.rms_norm(&s.k, 0, kn, &s.kn, 0, n * h.n_head_kv, h.rms_eps)?;
                (&s.qn, &s.kn)
            }
            (QkNorm::Full, Some(qn), Some(kn)) => {
                ops.rms_norm(&s.q, 0, qn, &s.qn, 0, n, h.rms_eps)?;
                ops.rms_norm(&s.k, 0, kn, &s.kn, 0, n, h.rms_eps)?;
                (&s.qn, &s.kn)
            }
        };
        ops.rope(q, &s.pos, n, h.n_head, h.head_dim, &h.rope)?;
        ops.rope(k, &s.pos, n, h.n_head_kv, h.head_dim, &h.rope)?;
        kv.store(ops, il, k, &s.v, &s.pos, h.kv_dim(), n)?;
        Ok(q)
    }

    /// Attention of the rotated queries `q` over the cache, and the output projection
    /// into `s.tmp`; with `ffn_norm` (decode), where it fits, also the residual add into
    /// `s.x2` and the FFN norm into `s.xn` in the same launch: then true.
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        ops: &Ops<'_>,
        s: &Scratch,
        a: &Attention,
        kv: &KvCache,
        il: usize,
        n: u32,
        per_row: bool,
        q: &DeviceBuffer<f32>,
        ffn_norm: Option<&Vector>,
    ) -> Result<bool> {
        let h = &self.hp;
        let heads = (h.n_head, h.n_head_kv, h.head_dim);
        kv.attend(ops, il, q, &s.pos, &s.att, n, heads, h.attn_scale, per_row)?;
        if let Some(norm) = ffn_norm.filter(|w| a.bo.is_none() && w.len == a.wo.m) {
            let (x2, xn, done) = (&s.x2, &s.xn, &s.norm_done);
            let norm = (norm, h.rms_eps);
            ops.mul_mat_add_rms_norm(&a.wo, &s.att, &s.tmp, &s.x, x2, norm, xn, done, n)?;
            return Ok(true);
        }
        ops.mul_mat(&a.wo, &s.att, 0, &s.tmp, n)?;
        if let Some(b) = &a.bo {
            ops.add_rows(&s.tmp, b, n)?;
        }
        Ok(false)
    }

    /// FFN of the normalised `s.xn` into `s.tmp`, or (`fused`, routed experts on the
    /// device, no shared expert) left as the experts' rows in `s.moe_y` with their weights
    /// in `s.expert_w` for combine_add_rms_norm to sum, or with `next_norm` (decode) summed
    /// with the residual into `s.x` and normalised into `s.xn` by the down projection.
    #[allow(clippy::too_many_arguments)]
    fn ffn<'e>(
        &self,
        ops: &Ops<'_>,
        s: &Scratch,
        ffn: &Ffn,
        il: usize,
        n: u32,
        experts: Option<&mut (dyn RoutedExperts + 'e)>,
        fused: bool,
        next_norm: Option<&Vector>,
    ) -> Result<FfnOut> {
        let h = &self.hp;
        match ffn {
            Ffn::Dense { gate, up, down } => {
                ops.mul_mat(gate, &s.xn, 0, &s.fa, n)?;
                ops.mul_mat(up, &s.xn, 0, &s.fb, n)?;
                ops.swiglu(&s.fa, &s.fb, &s.fc, n * gate.m)?;
                ops.mul_mat(down, &s.fc, 0, &s.tmp, n)?;
            }
            Ffn::Moe {
                router,
                gate,
                up,
                down,
                shared,
            } => {
                let moe = h.moe.as_ref().ok_or_else(|| {
                    ModelError::BadHParams("MoE weights without MoE hyper-parameters".into())
                })?;
                let k = moe.n_expert_used;
                if fused && n == 1 && router.m == moe.n_expert && ops.has_router_matvec_topk() {
                    // Decode: the router's product and its top-k in one launch.
                    ops.router_matvec_topk(
                        router,
                        &s.xn,
                        &s.router,
                        &s.expert_ids,
                        &s.expert_w,
                        &s.router_done,
                        n,
                        k,
                        moe.norm_topk,
                    )?;
                } else {
                    ops.mul_mat(router, &s.xn, 0, &s.router, n)?;
                    ops.router_topk(
                        &s.router,
                        &s.expert_ids,
                        &s.expert_w,
                        n,
                        moe.n_expert,
                        k,
                        moe.norm_topk,
                    )?;
                }
                match (experts, &gate.buf, &up.buf, &down.buf) {
                    (Some(runner), _, _, _) => {
                        let io = MoeIo {
                            layer: il,
                            n_tokens: n,
                            n_used: k,
                            n_embd: h.n_embd,
                            xn: &s.xn,
                            expert_ids: &s.expert_ids,
                            expert_w: &s.expert_w,
                            fa: &s.fa,
                            fb: &s.fb,
                            fc: &s.fc,
                            moe_y: &s.moe_y,
                            out: &s.tmp,
                            gate,
                            up,
                            down,
                        };
                        runner.run(ops, &io)?;
                    }
                    (None, Some(wg), Some(wu), Some(wd)) => {
                        let y = &s.moe_y;
                        // One launch for gate, up and SwiGLU where the fused form fits:
                        // decode steps and verify windows (Ops::gate_up_in_one_launch)
                        // of one quantised type.
                        let gate_up = fused
                            && ops.gate_up_in_one_launch(n, k)
                            && gate.ty == up.ty
                            && gate.ty.block_size() > 1
                            && (gate.m, gate.k) == (up.m, up.k);
                        if gate_up {
                            let ids = &s.expert_ids;
                            ops.experts_gate_up((gate, wg), (up, wu), &s.xn, ids, &s.fc, n, k)?;
                        } else {
                            let ids = &s.expert_ids;
                            ops.mul_mat_experts(gate, wg, &s.xn, ids, &s.fa, n, k, false)?;
                            ops.mul_mat_experts(up, wu, &s.xn, ids, &s.fb, n, k, false)?;
                            ops.swiglu(&s.fa, &s.fb, &s.fc, n * k * gate.m)?;
                        }
                        let ids = &s.expert_ids;
                        let merged = next_norm.filter(|w| shared.is_none() && w.len == down.m);
                        if let Some(norm) = merged {
                            let (w, res, sum, xn) = (&s.expert_w, &s.x2, &s.x, &s.xn);
                            let norm = (norm, h.rms_eps);
                            let done = &s.norm_done;
                            let down = (down, wd);
                            ops.experts_down_norm(
                                down, &s.fc, ids, y, w, res, sum, norm, xn, done, n, k,
                            )?;
                            return Ok(FfnOut::Normed);
                        }
                        ops.mul_mat_experts(down, wd, &s.fc, ids, y, n, k, true)?;
                        if fused && shared.is_none() {
                            return Ok(FfnOut::Slots { n_used: k });
                        }
                        ops.moe_combine(&s.moe_y, &s.expert_w, &s.tmp, n, k, h.n_embd)?;
                    }
                    (None, _, _, _) => return Err(ModelError::ExpertsNotOnDevice),
                }
                if let Some(sh) = shared {
                    ops.mul_mat(&sh.gate, &s.xn, 0, &s.fa, n)?;
                    ops.mul_mat(&sh.up, &s.xn, 0, &s.fb, n)?;
                    ops.swiglu(&s.fa, &s.fb, &s.fc, n * sh.gate.m)?;
                    ops.mul_mat(&sh.down, &s.fc, 0, &s.shared, n)?;
                    ops.mul_mat(&sh.gate_inp, &s.xn, 0, &s.gate_logit, n)?;
                    ops.sigmoid_gate_add(&s.shared, &s.gate_logit, &s.tmp, n, h.n_embd)?;
                }
            }
        }
        Ok(FfnOut::Tmp)
    }
}

/// Where an FFN left its output.
enum FfnOut {
    /// In `s.tmp`.
    Tmp,
    /// As `n_used` expert rows per token in `s.moe_y`, weighted by `s.expert_w`.
    Slots { n_used: u32 },
    /// Added to the residual (`s.x`) and normalised for what comes next (`s.xn`).
    Normed,
}
