//! Slots lent to the K/V (`--kv-grow`): growing the K/V takes the cache's last slots; the
//! hot experts that sat in them move into the slots of colder experts, so what leaves the
//! device is the coldest. Trimming returns the slots and refills them with the hottest
//! experts not resident (profile and routing counts), [`REFILL_AT_TRIM`] at once and the
//! rest [`REFILL_PER_STEP`] a step after, so a trim of hundreds of slots does not stall the
//! next request. A lent slot keeps
//! its expert's bytes (the K/V has buffers of its own), so a refill that wants that expert
//! names the slot again with no copy at all; only the others are uploaded. Every table
//! change is published by an ordered upload on the copy stream and every expert move or
//! refill is an ordered copy there: kernels that read the table or the slots wait for them
//! on the device, so the host waits for none of it. (The slots are lent logically: the
//! K/V never writes their memory, so nothing else has to wait for the moves either.)

use std::time::Instant;

use super::{ExpertCache, by_heat};
use crate::experts::ExpertError;
use crate::experts::residency::TableUpload;

/// Slots a trim refills before it returns (the rest: [`REFILL_PER_STEP`] a step after).
/// 16 slots of Qwen3-30B-A3B are 42 MB: on the H200 host their copy from the mapped file
/// took 1.97 and 2.89 ms of trims of 3.25 and 5.01 ms (issue 8 asks under 5), so 8.
pub const REFILL_AT_TRIM: usize = 8;
/// Free slots refilled between two steps after a trim.
pub const REFILL_PER_STEP: usize = 16;

/// What a take or a return did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotChange {
    /// Slots taken from the cache (or returned to it).
    pub slots: usize,
    /// Experts copied into other slots (moved on a take, refilled on a return).
    pub experts: usize,
    /// Of the refilled `experts`, those whose bytes were still in a returned slot (named
    /// there again, not copied).
    pub in_place: usize,
    /// Slots holding experts afterwards, and every slot of the cache.
    pub resident: usize,
    pub total: usize,
}

/// Host time of a take's or a return's parts, in seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SlotTimes {
    /// Queuing the copies: the moves of displaced experts (take), or the refills from the
    /// mapped file, their host copy into staging included (return).
    pub copies_s: f64,
    /// Queuing the residency table's upload.
    pub publish_s: f64,
}

impl ExpertCache {
    /// Bytes of one slot.
    pub fn slot_bytes(&self) -> u64 {
        self.layout.slot_bytes
    }

    /// Slots the K/V holds now.
    pub fn slots_taken(&self) -> usize {
        self.table.total_slots() - self.table.n_slots()
    }

    /// Takes up to `n` of the slots that hold experts (the last ones) for the K/V.
    pub fn take_slots(&mut self, n: usize) -> Result<SlotChange, ExpertError> {
        self.take_slots_timed(n).map(|(change, _)| change)
    }

    /// [`ExpertCache::take_slots`], with the host time of its moves and table upload.
    pub fn take_slots_timed(&mut self, n: usize) -> Result<(SlotChange, SlotTimes), ExpertError> {
        let t0 = Instant::now();
        let usable = self.table.n_slots();
        let keep = usable - n.min(usable);
        let ne = self.layout.n_expert as usize;
        let heat = |c: &[u64], (l, e): (usize, u32)| c[l * ne + e as usize];
        // The experts of the taken slots (with their slot), hottest first.
        let mut displaced: Vec<((usize, u32), usize)> = (keep..usable)
            .filter_map(|s| self.table.owner(s).map(|o| (o, s)))
            .collect();
        displaced.sort_by(|(a, _), (b, _)| {
            heat(&self.counts, *b)
                .cmp(&heat(&self.counts, *a))
                .then(a.cmp(b))
        });
        for s in keep..usable {
            self.table.evict(s);
        }
        self.table.set_usable(keep);
        // The kept slots, coldest first (empty ones before any expert).
        let mut cold: Vec<(Option<u64>, usize)> = (0..keep)
            .map(|s| (self.table.owner(s).map(|o| heat(&self.counts, o)), s))
            .collect();
        cold.sort_unstable();
        let mut moved = 0;
        for (&(expert, from), &(c_cold, slot)) in displaced.iter().zip(&cold) {
            if c_cold.is_some_and(|c| c >= heat(&self.counts, expert)) {
                break;
            }
            self.move_expert(from, slot, expert)?;
            moved += 1;
        }
        let t1 = Instant::now();
        self.publish()?;
        // No host wait: the K/V does not write the taken slots (it has buffers of its own),
        // and every kernel that reads the slots or the table is ordered after the moves and
        // the upload by core.
        let times = SlotTimes {
            copies_s: (t1 - t0).as_secs_f64(),
            publish_s: t1.elapsed().as_secs_f64(),
        };
        Ok((self.change(usable - keep, moved, 0), times))
    }

    /// Returns `n` of the slots the K/V took (one context's: several contexts may hold
    /// some at once) and fills up to [`REFILL_AT_TRIM`] of the free slots with the hottest
    /// experts not resident, by profile and routing counts, publishing the table through
    /// `upload` (ordered: `Device::upload`). The other free slots are refilled a batch per
    /// step by [`ExpertCache::between_steps`]: a trim of hundreds of slots would otherwise
    /// stall the next request on hundreds of MB of uploads from the mapped file.
    pub fn return_slots_with(
        &mut self,
        n: usize,
        upload: &mut TableUpload<'_>,
    ) -> Result<SlotChange, ExpertError> {
        self.return_slots_timed(n, upload).map(|(change, _)| change)
    }

    /// [`ExpertCache::return_slots_with`], with the host time of its refills and table
    /// upload. Nothing is waited for: the next step's kernels wait for the refills and the
    /// table on the device.
    pub fn return_slots_timed(
        &mut self,
        n: usize,
        upload: &mut TableUpload<'_>,
    ) -> Result<(SlotChange, SlotTimes), ExpertError> {
        let t0 = Instant::now();
        let returned = n.min(self.slots_taken());
        self.table.set_usable(self.table.n_slots() + returned);
        let (filled, in_place) = self.fill_free_slots(REFILL_AT_TRIM)?;
        self.refill_pending = filled == REFILL_AT_TRIM;
        let t1 = Instant::now();
        if self.table.publish_with(&self.dev, self.copy, upload)? {
            self.stats.bytes_fill += self.table.table_bytes();
        }
        let times = SlotTimes {
            copies_s: (t1 - t0).as_secs_f64(),
            publish_s: t1.elapsed().as_secs_f64(),
        };
        Ok((self.change(returned, filled, in_place), times))
    }

    /// Fills up to `most` free slots with the hottest experts not resident, publishing the
    /// table; how many it filled.
    pub(super) fn refill_free_slots(&mut self, most: usize) -> Result<usize, ExpertError> {
        let (filled, _) = self.fill_free_slots(most)?;
        if filled > 0 {
            self.publish()?;
        }
        Ok(filled)
    }

    /// Fills up to `most` free slots with the hottest experts not resident, in the host
    /// table; how many it filled, and how many of those were named where their bytes
    /// still were. Which experts become resident does not depend on where bytes are; only
    /// the slots they land in do. The uploaded ones go to the free slots whose bytes are
    /// least worth keeping (none or a resident expert's, then the coldest expert's, then
    /// the lowest slot).
    fn fill_free_slots(&mut self, most: usize) -> Result<(usize, usize), ExpertError> {
        let ne = self.layout.n_expert as usize;
        let (table, layout) = (&self.table, &self.layout);
        let mut free: Vec<usize> = (0..table.n_slots())
            .filter(|&s| table.owner(s).is_none())
            .collect();
        let want: Vec<(usize, u32)> = by_heat(&self.counts, ne, |l, e| {
            layout.is_expert(l, e) && table.slot_of(l, e).is_none()
        })
        .into_iter()
        .take(most.min(free.len()))
        .collect();
        let mut upload = Vec::new();
        let mut in_place = 0;
        for &(l, e) in &want {
            match free.iter().position(|&s| self.held[s] == Some((l, e))) {
                Some(i) => {
                    self.table.assign(free.swap_remove(i), l, e);
                    in_place += 1;
                }
                None => upload.push((l, e)),
            }
        }
        // A copy of an expert that is resident elsewhere (a moved one's) is worth nothing.
        let table = &self.table;
        let heat = |s: usize| {
            self.held[s]
                .filter(|&(l, e)| table.slot_of(l, e).is_none())
                .map(|(l, e)| self.counts[l * ne + e as usize])
        };
        free.sort_by_key(|&s| (heat(s), s));
        let fills: Vec<(usize, usize, u32)> = free
            .iter()
            .zip(&upload)
            .map(|(&slot, &(l, e))| (slot, l, e))
            .collect();
        self.fill_many(&fills)?;
        Ok((want.len(), in_place))
    }

    /// Copies the expert of slot `from` (already evicted from the table) into slot `to`,
    /// device to device on the copy stream: a grow's stall is then a copy inside device
    /// memory, not an upload of the expert's bytes from the mapped file (200 MB for 76
    /// slots of Qwen3-30B-A3B, tens of ms over PCIe).
    fn move_expert(
        &mut self,
        from: usize,
        to: usize,
        (layer, e): (usize, u32),
    ) -> Result<(), ExpertError> {
        let sb = self.layout.slot_bytes as usize;
        self.dev
            .copy_range(&self.slots, to * sb, &self.slots, from * sb, sb, self.copy)?;
        self.table.assign(to, layer, e);
        self.held[to] = Some((layer, e));
        self.stats.slot_fills += 1;
        Ok(())
    }

    fn change(&self, slots: usize, experts: usize, in_place: usize) -> SlotChange {
        SlotChange {
            slots,
            experts,
            in_place,
            resident: self.table.resident_count(),
            total: self.table.total_slots(),
        }
    }
}
