//! The residency table: (layer, expert) -> slot or -1. The host copy is the truth the CPU
//! pool plans from; the device copy is what the cached kernels read. Every change is
//! published by an ordered upload of the whole host table into the same device buffer
//! (never a raw copy, never a new allocation), so no kernel or graph queued after it can
//! read a stale table, and none queued before it sees the new one.

use strata_core::{Device, DeviceBuffer, Stream};

use super::ExpertError;

/// How a table reaches the device: `Device::upload` everywhere but in the sanitizer
/// tests that prove an unordered one is caught.
pub type TableUpload<'a> =
    dyn FnMut(&Device, &DeviceBuffer<i32>, &[i32], Stream) -> strata_core::Result<()> + 'a;

pub struct Residency {
    n_expert: usize,
    host: Vec<i32>,
    /// Which (layer, expert) each slot holds.
    owners: Vec<Option<(usize, u32)>>,
    /// Slots `0..usable` hold experts; the others are taken by the K/V (`--kv-grow`).
    usable: usize,
    device: DeviceBuffer<i32>,
    /// Whether `host` has changes the device copy lacks.
    dirty: bool,
    /// Uploads of the table so far (each one is `host.len() * 4` bytes).
    pub uploads: u64,
}

impl Residency {
    /// An empty table (nothing resident) of `n_layer` x `n_expert`, and `n_slots` slots.
    pub fn new(
        dev: &Device,
        stream: Stream,
        n_layer: usize,
        n_expert: usize,
        n_slots: usize,
    ) -> Result<Self, ExpertError> {
        let host = vec![-1i32; (n_layer * n_expert).max(1)];
        let device = dev.alloc_from(&host, stream)?;
        Ok(Residency {
            n_expert,
            host,
            owners: vec![None; n_slots],
            usable: n_slots,
            device,
            dirty: false,
            uploads: 1,
        })
    }

    /// Slots that may hold experts (all of them unless the K/V took some).
    pub fn n_slots(&self) -> usize {
        self.usable
    }

    /// Every slot, taken or not.
    pub fn total_slots(&self) -> usize {
        self.owners.len()
    }

    /// Makes slots `0..n` the ones that may hold experts; the others must be empty.
    pub fn set_usable(&mut self, n: usize) {
        debug_assert!(
            self.owners[n.min(self.owners.len())..]
                .iter()
                .all(Option::is_none)
        );
        self.usable = n.min(self.owners.len());
    }

    /// The slot of (layer, expert), if resident.
    pub fn slot_of(&self, layer: usize, e: u32) -> Option<usize> {
        let s = *self.host.get(layer * self.n_expert + e as usize)?;
        usize::try_from(s).ok()
    }

    pub fn owner(&self, slot: usize) -> Option<(usize, u32)> {
        self.owners.get(slot).copied().flatten()
    }

    pub fn free_slot(&self) -> Option<usize> {
        self.owners[..self.usable].iter().position(|o| o.is_none())
    }

    pub fn resident_count(&self) -> usize {
        self.owners.iter().filter(|o| o.is_some()).count()
    }

    /// Marks `slot` as holding (layer, e), evicting its previous owner, in the host table
    /// only; [`Residency::publish`] makes the device copy equal again.
    pub fn assign(&mut self, slot: usize, layer: usize, e: u32) {
        if let Some((l, x)) = self.owners[slot].take() {
            self.host[l * self.n_expert + x as usize] = -1;
        }
        self.host[layer * self.n_expert + e as usize] = slot as i32;
        self.owners[slot] = Some((layer, e));
        self.dirty = true;
    }

    /// Forgets what `slot` holds (its expert goes back to the CPU pool).
    pub fn evict(&mut self, slot: usize) {
        if let Some((l, x)) = self.owners[slot].take() {
            self.host[l * self.n_expert + x as usize] = -1;
            self.dirty = true;
        }
    }

    /// Uploads the host table into the device table on `stream`, ordered after every
    /// earlier access of it and before every later one.
    pub fn publish(&mut self, dev: &Device, stream: Stream) -> Result<bool, ExpertError> {
        self.publish_with(dev, stream, &mut |d, buf, host, s| d.upload(buf, host, s))
    }

    /// [`Residency::publish`] through `upload` (tests give an unordered one, to show the
    /// sanitizer catches it).
    pub fn publish_with(
        &mut self,
        dev: &Device,
        stream: Stream,
        upload: &mut TableUpload<'_>,
    ) -> Result<bool, ExpertError> {
        if !self.dirty {
            return Ok(false);
        }
        upload(dev, &self.device, &self.host, stream)?;
        self.dirty = false;
        self.uploads += 1;
        Ok(true)
    }

    /// The device table (for the kernels' arguments).
    pub fn device(&self) -> &DeviceBuffer<i32> {
        &self.device
    }

    /// The host table (for tests: it must equal a download of the device table).
    pub fn host(&self) -> &[i32] {
        &self.host
    }

    pub fn table_bytes(&self) -> u64 {
        (self.host.len() * 4) as u64
    }
}
