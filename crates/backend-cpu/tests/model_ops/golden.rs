//! The ops against llama.cpp's ggml itself: tests/golden/model_ops/*.bin hold inputs and
//! ggml's outputs (tools/gen_model_ops_golden.c: rope incl. YaRN, rms_norm, mul_mat
//! with weights quantised by ggml, build_moe_ffn's routing, non-flash attention).

use std::collections::HashMap;

use strata_core::{Args, KernelId};
use strata_quant::QuantType;

use super::{assert_close, dev, download, launch, upload};

/// One golden case: named records of raw little-endian bytes.
struct Golden(HashMap<String, Vec<u8>>);

impl Golden {
    fn load(name: &str) -> Golden {
        let path = format!(
            "{}/../../tests/golden/model_ops/{name}.bin",
            env!("CARGO_MANIFEST_DIR")
        );
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let mut map = HashMap::new();
        let mut at = 0;
        let take = |at: &mut usize, n: usize| {
            let s = &bytes[*at..*at + n];
            *at += n;
            s
        };
        while at < bytes.len() {
            let len = u32::from_le_bytes(take(&mut at, 4).try_into().unwrap()) as usize;
            let key = String::from_utf8(take(&mut at, len).to_vec()).unwrap();
            let _dtype = take(&mut at, 4);
            let n = u64::from_le_bytes(take(&mut at, 8).try_into().unwrap()) as usize;
            map.insert(key, take(&mut at, n).to_vec());
        }
        Golden(map)
    }
    fn bytes(&self, key: &str) -> &[u8] {
        self.0
            .get(key)
            .unwrap_or_else(|| panic!("record {key} missing"))
    }
    fn f32s(&self, key: &str) -> Vec<f32> {
        self.bytes(key)
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }
    fn i32s(&self, key: &str) -> Vec<i32> {
        self.bytes(key)
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }
    fn u16s(&self, key: &str) -> Vec<u16> {
        self.bytes(key)
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }
    fn f64s(&self, key: &str) -> Vec<f64> {
        self.f32s(key).into_iter().map(f64::from).collect()
    }
}

#[test]
fn rope_matches_ggml() {
    let d = dev(2);
    for name in [
        "rope_normal",
        "rope_neox",
        "rope_normal_yarn",
        "rope_neox_yarn",
    ] {
        let g = Golden::load(name);
        let ip = g.i32s("int_params");
        let fp = g.f32s("float_params");
        let bx = upload(&d, &g.f32s("x"));
        let bp = upload(&d, &g.i32s("pos"));
        let mut args = Args::new().read_write(&bx).read(&bp);
        for &v in &ip[..5] {
            args = args.u32(v as u32);
        }
        for &v in &fp {
            args = args.f32(v);
        }
        launch(&d, KernelId::Rope, &args.u32(ip[5] as u32));
        assert_close(name, &download(&d, &bx), &g.f64s("y"), |_| 1e-5);
    }
}

#[test]
fn rms_norm_matches_ggml() {
    let d = dev(2);
    let g = Golden::load("rms_norm");
    let ip = g.i32s("int_params");
    let (bx, bw) = (upload(&d, &g.f32s("x")), upload(&d, &g.f32s("w")));
    let by = d.alloc::<f32>((ip[0] * ip[1]) as usize).unwrap();
    launch(
        &d,
        KernelId::RmsNorm,
        &Args::new()
            .read(&bx)
            .read(&bw)
            .write(&by)
            .u32(ip[0] as u32)
            .u32(ip[1] as u32)
            .f32(g.f32s("float_params")[0]),
    );
    let want = g.f64s("y");
    assert_close("rms_norm", &download(&d, &by), &want, |i| {
        want[i].abs() * 1e-6 + 1e-6
    });
}

#[test]
fn mul_mat_matches_ggml_with_ggml_quantised_weights() {
    let d = dev(2);
    let mut checked = Vec::new();
    for name in [
        "f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K", "q4_K",
        "q5_K", "q6_K", "iq4_nl", "iq4_xs", "mxfp4",
    ] {
        let g = Golden::load(&format!("mul_mat_{name}"));
        let ip = g.i32s("int_params");
        let ty = QuantType::from_id(ip[0] as u32).unwrap();
        if strata_quant::kernels(ty).is_none() {
            eprintln!("{ty:?}: no CPU kernels yet, skipped");
            continue;
        }
        let (m, k, n) = (ip[1] as usize, ip[2] as usize, ip[3] as usize);
        let (w, x) = (g.bytes("w"), g.f32s("x"));
        // Tolerance scale: Σ|w·x| over the (strata-)dequantised weights.
        let rb = ty.row_bytes(k).unwrap();
        let mut row = vec![0.0f32; k];
        let mut mag = Vec::new();
        for xr in x.chunks_exact(k) {
            for r in 0..m {
                strata_quant::dequantize_row(ty, &w[r * rb..(r + 1) * rb], &mut row).unwrap();
                mag.push(
                    row.iter()
                        .zip(xr)
                        .map(|(&a, &b)| f64::from(a * b).abs())
                        .sum::<f64>(),
                );
            }
        }
        let bw = upload(&d, w);
        for (rows, key) in [(n, "y"), (1, "y1")] {
            let bx = upload(&d, &x[..rows * k]);
            let by = d.alloc::<f32>(rows * m).unwrap();
            launch(
                &d,
                KernelId::MulMat,
                &Args::new()
                    .read(&bw)
                    .read(&bx)
                    .write(&by)
                    .u32(ty.id())
                    .u32(m as u32)
                    .u32(k as u32)
                    .u32(rows as u32),
            );
            // ggml's SIMD activation quantisers may round a tie the other way than the
            // reference ones: one quant step of one value, below 1e-4 of Σ|w·x|.
            assert_close(
                &format!("{name} n={rows}"),
                &download(&d, &by),
                &g.f64s(key),
                |i| mag[i] * 1e-4 + 1e-5,
            );
        }
        checked.push(name);
    }
    eprintln!("mul_mat agrees with ggml for {checked:?}");
}

#[test]
fn router_topk_matches_build_moe_ffn() {
    let d = dev(1);
    let g = Golden::load("router_topk");
    let ip = g.i32s("int_params");
    let (n_tokens, n_expert, k) = (ip[0] as usize, ip[1] as usize, ip[2] as usize);
    let bl = upload(&d, &g.f32s("logits"));
    let (ids, w) = (
        d.alloc::<i32>(n_tokens * k).unwrap(),
        d.alloc::<f32>(n_tokens * k).unwrap(),
    );
    for (norm, key) in [(0u32, "weights"), (1, "weights_norm")] {
        launch(
            &d,
            KernelId::RouterTopk,
            &Args::new()
                .read(&bl)
                .write(&ids)
                .write(&w)
                .u32(n_tokens as u32)
                .u32(n_expert as u32)
                .u32(k as u32)
                .u32(norm),
        );
        assert_eq!(download(&d, &ids), g.i32s("ids"), "expert ids");
        let want = g.f64s(key);
        assert_close(key, &download(&d, &w), &want, |i| {
            want[i].abs() * 1e-6 + 1e-7
        });
    }
}

#[test]
fn attention_matches_ggml() {
    let d = dev(2);
    let g = Golden::load("attention");
    let ip = g.i32s("int_params");
    let bq = upload(&d, &g.f32s("q"));
    let (kc, vc) = (
        upload(&d, &g.u16s("k_cache")),
        upload(&d, &g.u16s("v_cache")),
    );
    let want = g.f64s("out");
    let out = d.alloc::<f32>(want.len()).unwrap();
    // int_params: n_tokens, n_head, n_kv_head, head_dim, pos0 (the tokens' first position).
    let (n_tokens, kv_dim, pos0) = (ip[0], ip[2] * ip[3], ip[4]);
    let pos = upload(&d, &(pos0..pos0 + n_tokens).collect::<Vec<i32>>());
    let n_ctx = g.u16s("k_cache").len() as u32 / kv_dim as u32;
    let mut args = Args::new()
        .read(&bq)
        .read(&pos)
        .read(&kc)
        .read(&vc)
        .write(&out);
    for &v in &ip[..4] {
        args = args.u32(v as u32);
    }
    args = args.u32(n_ctx);
    launch(
        &d,
        KernelId::Attention,
        &args.f32(g.f32s("float_params")[0]),
    );
    // ggml rounds the probabilities to f16 before the V product; strata keeps them f32.
    assert_close("attention", &download(&d, &out), &want, |_| 2e-3);
}
