//! Staging sets: a layer's experts uploaded next to the cache for one pass, from their
//! slots when resident and from the mapped file otherwise. A long batch lends its layers
//! (every routed expert of the layer staged and computed on the device, the next layer's
//! prefetched into the other set meanwhile); a short one streams a few of the pool's
//! experts (`--stream-experts`) while the pool computes the rest.

use strata_model::MoeIo;
use strata_model::ops::Ops;

use super::ExpertCache;
use crate::experts::ExpertError;

impl ExpertCache {
    /// Queues `layer`'s experts into staging set `set`: those `want` names that are not
    /// `done` already, from their slots when resident (if `from_slots`), otherwise from
    /// the file (a matrix's runs of consecutive experts in one upload of several pieces).
    /// Returns which ones came from the file.
    fn stage(
        &mut self,
        set: usize,
        layer: usize,
        want: &[bool],
        done: Option<&[bool]>,
        from_slots: bool,
    ) -> Result<Vec<bool>, ExpertError> {
        let ne = self.layout.n_expert as usize;
        let lay = self.layout.layers[layer].ok_or(ExpertError::NotMoe(layer))?;
        if self.lend.is_none() {
            let mut bytes = [0u64; 3];
            for l in self.layout.layers.iter().flatten() {
                for (b, m) in bytes.iter_mut().zip(&l.mats) {
                    *b = (*b).max(m.bytes * ne as u64);
                }
            }
            let alloc = |b: u64| {
                usize::try_from(b)
                    .map_err(|_| ExpertError::TooManySlots(ne))
                    .and_then(|b| Ok(self.dev.alloc::<u8>(b)?))
            };
            let mut sets = Vec::new();
            for _ in 0..2 {
                sets.push([alloc(bytes[0])?, alloc(bytes[1])?, alloc(bytes[2])?]);
            }
            self.lend = Some(sets);
        }
        let Some(lend) = self.lend.as_ref().and_then(|l| l.get(set)) else {
            return Err(ExpertError::PoolDevice);
        };
        let file = self.gguf.bytes();
        let sb = self.layout.slot_bytes as usize;
        let resident = |e: usize| self.table.slot_of(layer, e as u32);
        let pending = |e: usize| want[e] && !done.is_some_and(|d| d[e]);
        let mut uploaded = vec![false; ne];
        for (buf, m) in lend.iter().zip(&lay.mats) {
            let eb = m.bytes as usize;
            // The matrix's runs of experts from the file, uploaded together at the end.
            let mut pieces: Vec<(usize, &[u8])> = Vec::new();
            let mut e = 0;
            while e < ne {
                if !pending(e) {
                    e += 1;
                    continue;
                }
                if let Some(slot) = resident(e) {
                    if from_slots {
                        let from = slot * sb + m.slot_offset as usize;
                        self.dev
                            .copy_range(buf, e * eb, &self.slots, from, eb, self.copy)?;
                    }
                    e += 1;
                    continue;
                }
                let start = e;
                while e < ne && pending(e) && resident(e).is_none() {
                    uploaded[e] = true;
                    e += 1;
                }
                let range = m.file_range(start as u32).start..m.file_range(e as u32 - 1).end;
                let bytes = file
                    .get(range)
                    .ok_or(ExpertError::OutsideFile(layer, start as u32))?;
                pieces.push((start * eb, bytes));
                self.stats.bytes_lend += bytes.len() as u64;
            }
            self.dev.upload_ranges(buf, &pieces, self.copy)?;
        }
        Ok(uploaded)
    }

    /// Takes up to `limit` of the pool's experts of layer `il` (the first
    /// ones its pairs name) off the pool: their matrices are uploaded into a staging set,
    /// which the returned index names, and their pairs' rows become device rows
    /// (`host_row` -1). The pool's lists are rebuilt in the same order.
    pub(super) fn stream_misses(
        &mut self,
        il: usize,
        host_row: &mut [i32],
        cpu_ids: &mut Vec<i32>,
        cpu_tok: &mut Vec<usize>,
        k: usize,
        limit: usize,
    ) -> Result<usize, ExpertError> {
        let ne = self.layout.n_expert as usize;
        let mut want = vec![false; ne];
        let mut picked = 0;
        for &id in cpu_ids.iter() {
            if picked == limit {
                break;
            }
            if !want[id as usize] {
                want[id as usize] = true;
                picked += 1;
            }
        }
        let (mut ids, mut toks) = (Vec::new(), Vec::new());
        for (p, row) in host_row.iter_mut().enumerate() {
            if *row < 0 {
                continue;
            }
            let id = cpu_ids[*row as usize];
            if want[id as usize] {
                *row = -1;
            } else {
                *row = ids.len() as i32;
                ids.push(id);
                toks.push(p / k);
            }
        }
        *cpu_ids = ids;
        *cpu_tok = toks;
        // A lent batch's prefetch is consumed by its next layer within the same pass, so
        // none is pending between passes; dropped anyway, as the set is overwritten here.
        self.prefetched = None;
        let set = 1 - self.last_set;
        self.last_set = set;
        self.stage(set, il, &want, None, false)?;
        let table: Vec<i32> = (0..ne as i32)
            .map(|e| if want[e as usize] { e } else { -1 })
            .collect();
        if self.stream_table.is_none() {
            self.stream_table = Some(self.dev.alloc(ne)?);
        }
        if let Some(t) = &self.stream_table {
            self.dev.upload(t, &table, self.copy)?;
        }
        self.stats.streamed_experts += picked as u64;
        Ok(set)
    }

    /// A long batch: the layer's routed experts go to a staging set (from their slots when
    /// resident, from the file otherwise, unless the previous layer prefetched them) and
    /// the whole layer runs on the device with the uncached kernels. Then the next MoE
    /// layer's non-resident experts are prefetched into the other set, so their upload
    /// overlaps this layer's work.
    pub(super) fn run_lent(
        &mut self,
        ops: &Ops<'_>,
        io: &MoeIo<'_>,
        ids: &[i32],
    ) -> Result<(), ExpertError> {
        let il = io.layer;
        let ne = self.layout.n_expert as usize;
        let mut used = vec![false; ne];
        for &id in ids {
            used[id as usize] = true;
        }
        let (set, done) = match self.prefetched.take() {
            Some((l, set, done)) if l == il => (set, Some(done)),
            _ => (1 - self.last_set, None),
        };
        self.stage(set, il, &used, done.as_deref(), true)?;
        self.last_set = set;
        let Some([wg, wu, wd]) = self.lend.as_ref().and_then(|l| l.get(set)) else {
            return Err(ExpertError::PoolDevice);
        };
        let (nt, nu) = (io.n_tokens, io.n_used);
        ops.mul_mat_experts(io.gate, wg, io.xn, io.expert_ids, io.fa, nt, nu, false)?;
        ops.mul_mat_experts(io.up, wu, io.xn, io.expert_ids, io.fb, nt, nu, false)?;
        ops.swiglu(io.fa, io.fb, io.fc, nt * nu * io.gate.m)?;
        ops.mul_mat_experts(io.down, wd, io.fc, io.expert_ids, io.moe_y, nt, nu, true)?;
        ops.moe_combine(io.moe_y, io.expert_w, io.out, nt, nu, io.n_embd)?;
        self.stats.lent_layers += 1;
        let next = (il + 1..self.layout.n_layer()).find(|&l| self.layout.layers[l].is_some());
        if let Some(next) = next {
            let all = vec![true; ne];
            let uploaded = self.stage(1 - set, next, &all, None, false)?;
            self.prefetched = Some((next, 1 - set, uploaded));
        }
        Ok(())
    }
}
