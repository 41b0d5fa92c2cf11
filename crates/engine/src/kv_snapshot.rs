//! A context's K/V copied to host memory, so a conversation can leave the device (parked)
//! and come back later into any free context of the same model: `export_kv` downloads the
//! rows of the first `n` positions, `import_kv` uploads them into another context. Both go
//! through the ordered Device API, so a captured decode graph that reads the K/V buffers
//! sees the imported rows. A snapshot also writes itself to and reads itself from a file
//! (the server spills parked conversations to disk).

use std::io::{Read, Write};

use strata_model::KvFormat;

use crate::context::Context;

#[derive(Debug, thiserror::Error)]
pub enum KvSnapshotError {
    #[error(transparent)]
    Device(#[from] strata_core::Error),
    #[error("a K/V snapshot of {have} positions has no position {want}")]
    TooShort { have: usize, want: usize },
    #[error(
        "the snapshot's K/V shape ({layers} layers x {row} per position) is not the context's ({ctx_layers} x {ctx_row})"
    )]
    Shape {
        layers: usize,
        row: usize,
        ctx_layers: usize,
        ctx_row: usize,
    },
    #[error(
        "the snapshot's K/V is {snapshot}, the context's is {context}: a conversation cannot move between K/V formats"
    )]
    Format {
        snapshot: KvFormat,
        context: KvFormat,
    },
    #[error("{n} positions do not fit a context of {n_ctx}")]
    OverContext { n: usize, n_ctx: usize },
    #[error("growing the K/V for a snapshot: {0}")]
    Grow(String),
    #[error("reading or writing a K/V snapshot: {0}")]
    Io(#[from] std::io::Error),
    #[error("not a K/V snapshot file: {0}")]
    BadFile(String),
}

type Result<T> = std::result::Result<T, KvSnapshotError>;

/// The tokens of a conversation and, per layer, the K and V rows of those tokens.
#[derive(Clone, Debug, PartialEq)]
pub struct KvSnapshot {
    tokens: Vec<u32>,
    /// How the rows are stored (a snapshot only goes back into a cache of its format).
    format: KvFormat,
    /// Elements per position in one layer's K (and V) buffer.
    row: usize,
    k: Vec<Vec<u16>>,
    v: Vec<Vec<u16>>,
}

const MAGIC: &[u8; 8] = b"STRATAKV";
/// Version 2 added the K/V format to the header; version 1 files hold f16 rows.
const VERSION: u32 = 2;

impl KvSnapshot {
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// How the snapshot's rows are stored.
    pub fn format(&self) -> KvFormat {
        self.format
    }

    /// Host bytes held: the K/V rows and the token ids.
    pub fn bytes(&self) -> usize {
        let rows: usize = self.k.iter().chain(&self.v).map(Vec::len).sum();
        rows * 2 + self.tokens.len() * 4
    }

    /// Writes the snapshot: a header (version, layers, row, tokens, K/V format), the
    /// tokens, then each layer's K and V rows (little-endian).
    pub fn write_to(&self, w: &mut impl Write) -> Result<()> {
        w.write_all(MAGIC)?;
        for x in [
            VERSION as u64,
            self.k.len() as u64,
            self.row as u64,
            self.tokens.len() as u64,
            self.format.id() as u64,
        ] {
            w.write_all(&x.to_le_bytes())?;
        }
        let mut buf = Vec::with_capacity(1 << 16);
        for t in &self.tokens {
            buf.extend_from_slice(&t.to_le_bytes());
        }
        w.write_all(&buf)?;
        for rows in self.k.iter().zip(&self.v).flat_map(|(k, v)| [k, v]) {
            for chunk in rows.chunks(1 << 15) {
                buf.clear();
                for x in chunk {
                    buf.extend_from_slice(&x.to_le_bytes());
                }
                w.write_all(&buf)?;
            }
        }
        Ok(())
    }

    /// Reads what [`KvSnapshot::write_to`] wrote. The shape must be `layers` x `row` and
    /// the length at most `max_tokens`, so a damaged file cannot ask for a huge allocation.
    pub fn read_from(
        r: &mut impl Read,
        layers: usize,
        row: usize,
        max_tokens: usize,
    ) -> Result<Self> {
        let mut magic = [0u8; 8];
        r.read_exact(&mut magic)?;
        if &magic != MAGIC {
            return Err(KvSnapshotError::BadFile("wrong magic".into()));
        }
        let mut header = [0u64; 4];
        for h in &mut header {
            let mut b = [0u8; 8];
            r.read_exact(&mut b)?;
            *h = u64::from_le_bytes(b);
        }
        let [version, file_layers, file_row, n] = header;
        let format = match version {
            1 => KvFormat::F16,
            2 => {
                let mut b = [0u8; 8];
                r.read_exact(&mut b)?;
                let id = u64::from_le_bytes(b);
                u32::try_from(id)
                    .ok()
                    .and_then(KvFormat::from_id)
                    .ok_or_else(|| KvSnapshotError::BadFile(format!("K/V format {id}")))?
            }
            _ => return Err(KvSnapshotError::BadFile(format!("version {version}"))),
        };
        if file_layers != layers as u64 || file_row != row as u64 {
            return Err(KvSnapshotError::Shape {
                layers: file_layers as usize,
                row: file_row as usize,
                ctx_layers: layers,
                ctx_row: row,
            });
        }
        if n > max_tokens as u64 {
            return Err(KvSnapshotError::OverContext {
                n: n as usize,
                n_ctx: max_tokens,
            });
        }
        let n = n as usize;
        let mut bytes = vec![0u8; n * 4];
        r.read_exact(&mut bytes)?;
        let tokens = bytes
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let mut read_rows = || -> Result<Vec<u16>> {
            let mut bytes = vec![0u8; n * row * 2];
            r.read_exact(&mut bytes)?;
            Ok(bytes
                .chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
                .collect())
        };
        let mut k = Vec::with_capacity(layers);
        let mut v = Vec::with_capacity(layers);
        for _ in 0..layers {
            k.push(read_rows()?);
            v.push(read_rows()?);
        }
        let mut rest = [0u8; 1];
        if r.read(&mut rest)? != 0 {
            return Err(KvSnapshotError::BadFile("trailing bytes".into()));
        }
        Ok(KvSnapshot {
            tokens,
            format,
            row,
            k,
            v,
        })
    }
}

impl Context {
    /// Layers of the K/V cache and elements per position in each layer's K (and V).
    pub fn kv_shape(&self) -> (usize, usize) {
        (self.kv.layers(), self.kv.row_words())
    }

    /// Host bytes a snapshot of `n` positions takes.
    pub fn kv_snapshot_bytes(&self, n: usize) -> usize {
        let (layers, row) = self.kv_shape();
        n * (layers * row * 2 * 2 + 4)
    }

    /// Downloads the K/V rows of the first `n` positions (one layer's K or V at a time, so
    /// the staging memory stays one layer's size).
    pub fn export_kv(&self, n: usize) -> Result<KvSnapshot> {
        if n > self.tokens.len() {
            return Err(KvSnapshotError::TooShort {
                have: self.tokens.len(),
                want: n,
            });
        }
        let (layers, row) = self.kv_shape();
        let mut k = Vec::with_capacity(layers);
        let mut v = Vec::with_capacity(layers);
        let stride = self.kv.layer_words();
        for il in 0..layers {
            match self.kv.buffers().filter(|_| n > 0) {
                Some((kb, vb)) => {
                    let at = il * stride;
                    k.push(
                        self.dev
                            .download_range(kb, at, n * row, self.stream)?
                            .wait()?,
                    );
                    v.push(
                        self.dev
                            .download_range(vb, at, n * row, self.stream)?
                            .wait()?,
                    );
                }
                None => {
                    k.push(Vec::new());
                    v.push(Vec::new());
                }
            }
        }
        Ok(KvSnapshot {
            tokens: self.tokens[..n].to_vec(),
            format: self.kv.format,
            row,
            k,
            v,
        })
    }

    /// Replaces what this context holds by the first `n` positions of `snap`: their K/V
    /// rows are uploaded (ordered, into the same buffers) and the tokens set.
    pub fn import_kv(&mut self, snap: &KvSnapshot, n: usize) -> Result<()> {
        if snap.format != self.kv.format {
            return Err(KvSnapshotError::Format {
                snapshot: snap.format,
                context: self.kv.format,
            });
        }
        let (layers, row) = self.kv_shape();
        if snap.k.len() != layers || snap.row != row {
            return Err(KvSnapshotError::Shape {
                layers: snap.k.len(),
                row: snap.row,
                ctx_layers: layers,
                ctx_row: row,
            });
        }
        if n > snap.len() {
            return Err(KvSnapshotError::TooShort {
                have: snap.len(),
                want: n,
            });
        }
        if n > self.n_ctx() {
            return Err(KvSnapshotError::OverContext {
                n,
                n_ctx: self.n_ctx(),
            });
        }
        // Forget the old positions first: a failed upload leaves an empty context, never
        // one whose tokens disagree with its K/V.
        self.tokens.clear();
        // An elastic K/V grows to hold them (nothing to copy: the context is empty now).
        self.ensure_kv(n).map_err(|e| match e {
            crate::error::EngineError::Device(d) => KvSnapshotError::Device(d),
            other => KvSnapshotError::Grow(other.to_string()),
        })?;
        if let Some((kb, vb)) = self.kv.buffers().filter(|_| n > 0) {
            let stride = self.kv.layer_words();
            for il in 0..layers {
                let at = il * stride;
                self.dev
                    .upload_at(kb, at, &snap.k[il][..n * row], self.stream)?;
                self.dev
                    .upload_at(vb, at, &snap.v[il][..n * row], self.stream)?;
                // Wait per layer so the staging memory is reused, not grown per buffer.
                self.dev.record(self.stream)?.wait()?;
            }
        }
        self.tokens.extend_from_slice(&snap.tokens[..n]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn snapshot(n: usize, layers: usize, row: usize) -> KvSnapshot {
        let fill = |salt: usize| -> Vec<Vec<u16>> {
            (0..layers)
                .map(|l| {
                    (0..n * row)
                        .map(|i| (i * 31 + l * 7 + salt) as u16)
                        .collect()
                })
                .collect()
        };
        KvSnapshot {
            tokens: (0..n as u32).map(|t| t * 3 + 1).collect(),
            format: KvFormat::F16,
            row,
            k: fill(0),
            v: fill(1),
        }
    }

    #[test]
    fn a_file_round_trips_and_a_damaged_one_is_refused() {
        let snap = snapshot(5, 3, 4);
        let mut bytes = Vec::new();
        snap.write_to(&mut bytes).unwrap();
        assert_eq!(bytes.len(), 8 + 40 + 5 * 4 + 3 * 2 * 5 * 4 * 2);
        let back = KvSnapshot::read_from(&mut bytes.as_slice(), 3, 4, 100).unwrap();
        assert_eq!(back, snap);
        assert_eq!(back.bytes(), 3 * 2 * 5 * 4 * 2 + 5 * 4);
        // Wrong shape, too long, truncated, trailing bytes, wrong magic.
        assert!(matches!(
            KvSnapshot::read_from(&mut bytes.as_slice(), 3, 8, 100),
            Err(KvSnapshotError::Shape { .. })
        ));
        assert!(matches!(
            KvSnapshot::read_from(&mut bytes.as_slice(), 3, 4, 4),
            Err(KvSnapshotError::OverContext { .. })
        ));
        assert!(KvSnapshot::read_from(&mut &bytes[..bytes.len() - 1], 3, 4, 100).is_err());
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(KvSnapshot::read_from(&mut longer.as_slice(), 3, 4, 100).is_err());
        bytes[0] ^= 1;
        assert!(KvSnapshot::read_from(&mut bytes.as_slice(), 3, 4, 100).is_err());
    }

    fn tiny_model() -> (strata_core::Device, std::sync::Arc<strata_model::Model>) {
        use std::sync::Arc;
        use strata_model::Model;
        use strata_model::synth::{self, SynthSpec};

        let spec: SynthSpec = serde_json::from_value(serde_json::json!({
            "vocab": 512, "context_length": 4096, "rms_eps": 1e-6, "tie_embeddings": false,
            "head_dim": null, "ffn": 256, "experts": 0, "experts_used": 0,
            "expert_ffn": 128, "shared_ffn": 256, "router_skew": 0.0, "rope_freq_base": 10000.0,
            "arch": "llama", "layers": 2, "hidden": 256, "heads": 4, "kv_heads": 2, "seed": 5,
            "quant": "Q8_0",
        }))
        .unwrap();
        let dev = strata_backend_cpu::device(strata_backend_cpu::CpuOptions::from_env()).unwrap();
        let gguf =
            Arc::new(strata_gguf::GgufFile::from_bytes(synth::synthesize(&spec).unwrap()).unwrap());
        let model = Arc::new(Model::load(&dev, dev.main_stream(), gguf, |_, _| {}).unwrap());
        (dev, model)
    }

    /// A conversation moved through a snapshot (and a file) into a context that held
    /// other tokens continues with exactly the logits of the context it came from.
    #[test]
    fn an_imported_conversation_continues_bit_for_bit() {
        let (dev, model) = tiny_model();
        let prompt = [1u32, 7, 42, 99, 3, 250, 17];
        let mut src = Context::new(model.clone(), dev.clone(), 64, 4).unwrap();
        src.eval(&prompt).unwrap();
        let snap = src.export_kv(prompt.len()).unwrap();
        assert_eq!(snap.tokens(), prompt);
        assert_eq!(snap.bytes(), src.kv_snapshot_bytes(prompt.len()));
        let want = src.eval(&[11]).unwrap();
        let want2 = src.eval(&[12]).unwrap();

        let mut file = Vec::new();
        snap.write_to(&mut file).unwrap();
        let (layers, row) = src.kv_shape();
        let from_file = KvSnapshot::read_from(&mut file.as_slice(), layers, row, 64).unwrap();
        for s in [&snap, &from_file] {
            // A context busy with another conversation (and its decode graph captured).
            let mut dst = Context::new(model.clone(), dev.clone(), 64, 4).unwrap();
            dst.eval(&[5, 6, 8, 9, 10, 300, 301, 302, 303]).unwrap();
            dst.eval(&[4]).unwrap();
            dst.import_kv(s, prompt.len()).unwrap();
            assert_eq!(dst.tokens(), prompt);
            assert_eq!(dst.eval(&[11]).unwrap(), want);
            assert_eq!(dst.eval(&[12]).unwrap(), want2);
        }
        // A prefix of the snapshot: the positions past it are not there.
        let mut dst = Context::new(model.clone(), dev.clone(), 64, 4).unwrap();
        dst.import_kv(&snap, 3).unwrap();
        let mut fresh = Context::new(model.clone(), dev.clone(), 64, 4).unwrap();
        fresh.eval(&prompt[..3]).unwrap();
        assert_eq!(dst.eval(&[77]).unwrap(), fresh.eval(&[77]).unwrap());
        assert!(dst.import_kv(&snap, prompt.len() + 1).is_err());
        assert!(src.export_kv(100).is_err());
    }

    /// An int8 conversation keeps its format through a file, continues bit for bit in
    /// another int8 context, and is refused by an f16 one (and the other way round).
    #[test]
    fn a_snapshot_goes_back_only_into_its_own_kv_format() {
        let (dev, model) = tiny_model();
        let prompt = [3u32, 9, 27, 81, 243, 200];
        let mut src = Context::with_kv(model.clone(), dev.clone(), 64, 4, KvFormat::Int8).unwrap();
        src.eval(&prompt).unwrap();
        let snap = src.export_kv(prompt.len()).unwrap();
        assert_eq!(snap.format(), KvFormat::Int8);
        assert_eq!(snap.bytes(), src.kv_snapshot_bytes(prompt.len()));
        let want = src.eval(&[11]).unwrap();
        let mut file = Vec::new();
        snap.write_to(&mut file).unwrap();
        let (layers, row) = src.kv_shape();
        // 2 K/V heads of 64: 128 values per row, 4 q8_0 blocks of 17 u16.
        assert_eq!(row, 4 * 17);
        let back = KvSnapshot::read_from(&mut file.as_slice(), layers, row, 64).unwrap();
        assert_eq!(back, snap);
        let mut dst = Context::with_kv(model.clone(), dev.clone(), 64, 4, KvFormat::Int8).unwrap();
        dst.eval(&[5, 6, 7]).unwrap();
        dst.import_kv(&back, prompt.len()).unwrap();
        assert_eq!(dst.eval(&[11]).unwrap(), want);

        let mut f16 = Context::new(model.clone(), dev.clone(), 64, 4).unwrap();
        f16.eval(&prompt).unwrap();
        assert!(matches!(
            f16.import_kv(&snap, prompt.len()),
            Err(KvSnapshotError::Format {
                snapshot: KvFormat::Int8,
                context: KvFormat::F16
            })
        ));
        // The refused import left the f16 context as it was.
        assert_eq!(f16.tokens(), prompt);
        let f16_snap = f16.export_kv(prompt.len()).unwrap();
        assert!(matches!(
            dst.import_kv(&f16_snap, prompt.len()),
            Err(KvSnapshotError::Format { .. })
        ));
        // int8 logits are near the f16 ones (the same model, the same prompt).
        let (a, b) = (f16.eval(&[11]).unwrap(), want);
        let drift = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        let range = a.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        assert!(
            drift > 0.0 && drift < 0.05 * range,
            "drift {drift}, range {range}"
        );
    }
}
