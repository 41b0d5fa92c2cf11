//! The K/V cache's layout (crates/model/src/kv.rs): every layer's K in one buffer and V in
//! another, each layer handed to the kernels as a region. On the CPU backend in sanitizer
//! mode: storing into one layer leaves the others (and the padding between them) as they
//! were, and a layer's rows, and attention over them, are bit for bit those of a cache of
//! that one layer (the layout a layer had with buffers of its own); a store reaching past a
//! layer's rows is refused instead of landing in the next layer; growing and trimming keep
//! every layer's rows.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use strata_backend_cpu::CpuOptions;
use strata_core::{Device, DeviceBuffer};
use strata_model::KvFormat;
use strata_model::forward::KvCache;
use strata_model::ops::Ops;

const LAYERS: usize = 3;
/// One K/V head of 64 values (int8 needs a multiple of 32).
const HEADS: (u32, u32, u32) = (2, 1, 64);
const KV_DIM: usize = 64;
/// Not a multiple of the layer alignment in either format, so layers are padded.
const N_CTX: u32 = 5;
/// What every word holds before a test writes (a finite f16, and finite q8 bytes).
const SENTINEL: u16 = 0x1234;

fn dev() -> Device {
    strata_backend_cpu::device(CpuOptions {
        sanitize: true,
        max_dma_delay_us: 20,
        ..Default::default()
    })
    .unwrap()
}

/// Deterministic values in [-2, 2) on a 1/64 grid (exact in f16).
fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 256) as f32 / 64.0 - 2.0
        })
        .collect()
}

/// IEEE half bits of `x`, for values exact in f16 with a normal exponent (or zero).
fn f16_bits(x: f32) -> u16 {
    if x == 0.0 {
        return 0;
    }
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as u16 - 112;
    sign | (exp << 10) | ((b >> 13) & 0x3ff) as u16
}

fn cache(dev: &Device, layers: usize, n_ctx: u32, format: KvFormat) -> KvCache {
    let kv = KvCache::with_shape(dev, layers, KV_DIM, n_ctx, format).unwrap();
    let (k, v) = kv.buffers().unwrap();
    for b in [k, v] {
        dev.upload(b, &vec![SENTINEL; b.len()], dev.main_stream())
            .unwrap();
    }
    kv
}

fn download(dev: &Device, b: &DeviceBuffer<u16>) -> Vec<u16> {
    dev.download(b, dev.main_stream()).unwrap().wait().unwrap()
}

fn upload(dev: &Device, data: &[f32]) -> DeviceBuffer<f32> {
    let b = dev.alloc::<f32>(data.len()).unwrap();
    dev.upload(&b, data, dev.main_stream()).unwrap();
    b
}

fn positions(dev: &Device, data: &[i32]) -> DeviceBuffer<i32> {
    let b = dev.alloc::<i32>(data.len()).unwrap();
    dev.upload(&b, data, dev.main_stream()).unwrap();
    b
}

/// The words of layer `il` in `all` (one of a cache's two buffers), and whether every
/// word outside that layer's rows is still the sentinel.
fn layer_rows(kv: &KvCache, all: &[u16], il: usize) -> (Vec<u16>, bool) {
    let (at, len) = (il * kv.layer_words(), kv.n_ctx as usize * kv.row_words());
    let rest = all[..at].iter().chain(&all[at + len..]);
    (
        all[at..at + len].to_vec(),
        rest.into_iter().all(|&w| w == SENTINEL),
    )
}

#[test]
fn a_layer_is_a_cache_of_its_own_and_leaves_the_others_alone() {
    for format in [KvFormat::F16, KvFormat::Int8] {
        let dev = dev();
        let ops = Ops {
            dev: &dev,
            stream: dev.main_stream(),
        };
        let kv = cache(&dev, LAYERS, N_CTX, format);
        let one = cache(&dev, 1, N_CTX, format);
        assert_eq!(kv.layers(), LAYERS);
        assert!(
            kv.layer_words() > N_CTX as usize * kv.row_words()
                && (kv.layer_words() * 2).is_multiple_of(256),
            "{format}: layers padded to 256 bytes"
        );
        let n = 3u32;
        let (k, v) = (
            values(n as usize * KV_DIM, 1),
            values(n as usize * KV_DIM, 2),
        );
        let (kb, vb) = (upload(&dev, &k), upload(&dev, &v));
        let pos = positions(&dev, &[0, 1, 2]);
        kv.store(&ops, 1, &kb, &vb, &pos, KV_DIM as u32, n).unwrap();
        one.store(&ops, 0, &kb, &vb, &pos, KV_DIM as u32, n)
            .unwrap();
        let q = upload(&dev, &values((n * HEADS.0 * HEADS.2) as usize, 3));
        let outs = [(), ()].map(|_| dev.alloc::<f32>((n * HEADS.0 * HEADS.2) as usize).unwrap());
        kv.attend(&ops, 1, &q, &pos, &outs[0], n, HEADS, 0.125, false)
            .unwrap();
        one.attend(&ops, 0, &q, &pos, &outs[1], n, HEADS, 0.125, false)
            .unwrap();
        let (bufs, one_bufs) = (kv.buffers().unwrap(), one.buffers().unwrap());
        for (which, all, own) in [("K", bufs.0, one_bufs.0), ("V", bufs.1, one_bufs.1)] {
            let all = download(&dev, all);
            let own = download(&dev, own);
            let (rows, others_untouched) = layer_rows(&kv, &all, 1);
            assert!(
                others_untouched,
                "{format} {which}: a store into layer 1 wrote elsewhere"
            );
            assert_eq!(rows, own[..rows.len()], "{format} {which}: layer 1's rows");
            if format == KvFormat::F16 {
                let src = if which == "K" { &k } else { &v };
                let want: Vec<u16> = src.iter().map(|&x| f16_bits(x)).collect();
                assert_eq!(rows[..want.len()], want, "{which}: rows 0..3 in f16");
                assert!(rows[want.len()..].iter().all(|&w| w == SENTINEL));
            }
        }
        let got = outs.map(|o| dev.download(&o, dev.main_stream()).unwrap().wait().unwrap());
        let bits = |x: &Vec<f32>| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&got[0]),
            bits(&got[1]),
            "{format}: attention over layer 1"
        );
        dev.synchronize().unwrap();
    }
}

#[test]
fn a_store_past_a_layers_rows_is_refused() {
    let dev = dev();
    let ops = Ops {
        dev: &dev,
        stream: dev.main_stream(),
    };
    let kv = cache(&dev, LAYERS, N_CTX, KvFormat::F16);
    let (k, v) = (
        upload(&dev, &values(KV_DIM, 1)),
        upload(&dev, &values(KV_DIM, 2)),
    );
    // Row 6 of a 7-row cache starting at layer 1 is layer 2's row 0: inside the buffer,
    // outside layer 1's region.
    let past = (kv.layer_words() / kv.row_words()) as i32;
    let pos = positions(&dev, &[past]);
    let (kc, vc) = kv.layer(1).unwrap();
    ops.kv_store(&k, &v, &pos, kc, vc, KV_DIM as u32, 1, past as u32 + 1)
        .unwrap();
    let err = dev
        .synchronize()
        .expect_err("a store past layer 1's rows ran");
    assert!(err.to_string().contains("kv_store"), "{err}");
    let (bk, bv) = kv.buffers().unwrap();
    for b in [bk, bv] {
        assert!(download(&dev, b).iter().all(|&w| w == SENTINEL));
    }
    // The same store into the layer's last row is fine.
    let pos = positions(&dev, &[N_CTX as i32 - 1]);
    let (kc, vc) = kv.layer(1).unwrap();
    ops.kv_store(&k, &v, &pos, kc, vc, KV_DIM as u32, 1, N_CTX)
        .unwrap();
    dev.synchronize().unwrap();
    assert!(kv.layer(LAYERS).is_err());
    assert!(KvCache::empty(KvFormat::F16).layer(0).is_err());
}

#[test]
fn growing_and_trimming_keep_every_layers_rows() {
    for format in [KvFormat::F16, KvFormat::Int8] {
        let dev = dev();
        let s = dev.main_stream();
        let ops = Ops {
            dev: &dev,
            stream: s,
        };
        let kv = cache(&dev, LAYERS, N_CTX, format);
        let n = N_CTX;
        let pos = positions(&dev, &(0..n as i32).collect::<Vec<_>>());
        for il in 0..LAYERS {
            let k = upload(&dev, &values(n as usize * KV_DIM, 10 + il as u32));
            let v = upload(&dev, &values(n as usize * KV_DIM, 20 + il as u32));
            kv.store(&ops, il, &k, &v, &pos, KV_DIM as u32, n).unwrap();
        }
        let rows = |c: &KvCache, keep: usize| {
            let (k, v) = c.buffers().unwrap();
            let (k, v) = (download(&dev, k), download(&dev, v));
            (0..LAYERS)
                .map(|il| {
                    let at = il * c.layer_words();
                    let words = keep * c.row_words();
                    (k[at..at + words].to_vec(), v[at..at + words].to_vec())
                })
                .collect::<Vec<_>>()
        };
        let before = rows(&kv, n as usize);
        let grown = cache(&dev, LAYERS, 19, format);
        grown.copy_rows_from(&dev, &kv, n as usize, s).unwrap();
        assert_eq!(rows(&grown, n as usize), before, "{format}: grown");
        let trimmed = cache(&dev, LAYERS, 2, format);
        trimmed.copy_rows_from(&dev, &grown, n as usize, s).unwrap();
        let kept: Vec<_> = before
            .iter()
            .map(|(k, v)| {
                let w = 2 * kv.row_words();
                (k[..w].to_vec(), v[..w].to_vec())
            })
            .collect();
        assert_eq!(rows(&trimmed, 2), kept, "{format}: trimmed");
        let other = KvCache::with_shape(&dev, LAYERS - 1, KV_DIM, 8, format).unwrap();
        assert!(other.copy_rows_from(&dev, &kv, 2, s).is_err());
        dev.synchronize().unwrap();
    }
}
