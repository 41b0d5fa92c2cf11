//! Where each (layer, expert)'s matrices are: in the mapped file (the host view the CPU
//! pool reads and slot fills copy from) and inside a slot of the device cache.

use strata_model::Model;
use strata_model::model::Ffn;
use strata_model::weights::Experts;

/// Matrix offsets inside a slot are aligned so that GPU kernels may load whole vectors.
const SLOT_ALIGN: u64 = 256;

/// One matrix kind (gate, up or down) of a layer's experts.
#[derive(Clone, Copy, Debug)]
pub struct MatrixView {
    /// Byte offset of expert 0 in the mapped file.
    pub file_offset: u64,
    /// Bytes of one expert's matrix (and the stride between experts in the file).
    pub bytes: u64,
    /// Where the matrix starts inside a slot.
    pub slot_offset: u64,
}

impl MatrixView {
    /// The file byte range of expert `e`'s matrix.
    pub fn file_range(&self, e: u32) -> std::ops::Range<usize> {
        let start = self.file_offset + u64::from(e) * self.bytes;
        start as usize..(start + self.bytes) as usize
    }
}

/// A MoE layer's experts: gate, up and down, in slot order.
#[derive(Clone, Copy, Debug)]
pub struct LayerExperts {
    pub mats: [MatrixView; 3],
}

/// The expert geometry of a whole model.
#[derive(Clone, Debug)]
pub struct Layout {
    /// `None` for a dense layer.
    pub layers: Vec<Option<LayerExperts>>,
    pub n_expert: u32,
    pub n_used: u32,
    pub n_embd: u32,
    /// Bytes of one slot: the largest layer's gate, up and down, each aligned.
    pub slot_bytes: u64,
}

fn align(x: u64) -> u64 {
    x.div_ceil(SLOT_ALIGN) * SLOT_ALIGN
}

impl Layout {
    /// The layout of `model`'s routed experts; `None` for a dense model.
    pub fn of(model: &Model) -> Option<Layout> {
        let moe = model.hp.moe.as_ref()?;
        let mut slot_bytes = 0;
        let layers = model
            .layers
            .iter()
            .map(|l| match &l.ffn {
                Ffn::Moe { gate, up, down, .. } => {
                    let mut at = 0;
                    let mut view = |x: &Experts| {
                        let v = MatrixView {
                            file_offset: x.file_offset,
                            bytes: x.expert_bytes,
                            slot_offset: at,
                        };
                        at = align(at + x.expert_bytes);
                        v
                    };
                    let mats = [view(gate), view(up), view(down)];
                    slot_bytes = slot_bytes.max(at);
                    Some(LayerExperts { mats })
                }
                Ffn::Dense { .. } => None,
            })
            .collect();
        Some(Layout {
            layers,
            n_expert: moe.n_expert,
            n_used: moe.n_expert_used,
            n_embd: model.hp.n_embd,
            slot_bytes: slot_bytes.max(SLOT_ALIGN),
        })
    }

    pub fn n_layer(&self) -> usize {
        self.layers.len()
    }

    /// Experts of every MoE layer.
    pub fn n_routed(&self) -> usize {
        self.layers.iter().flatten().count() * self.n_expert as usize
    }

    /// Whether (layer, expert) exists.
    pub fn is_expert(&self, layer: usize, e: u32) -> bool {
        e < self.n_expert && self.layers.get(layer).is_some_and(|l| l.is_some())
    }
}
