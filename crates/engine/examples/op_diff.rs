//! Op-by-op comparison with llama.cpp: every kernel of a dense llama forward pass is fed
//! llama.cpp's own input tensor and its output compared with llama.cpp's, so the first
//! op that computes differently stands out (instead of an error grown over 30 layers).
//!
//! `op_diff MODEL.gguf DUMP_DIR ID... [-- DECODE_ID...]`: DUMP_DIR holds llama.cpp's graph
//! tensors as raw little-endian f32 files `s{step}_{name}.f32` (names as llama.cpp's graph
//! callback reports them: `attn_norm-3`, `Qcur-3_2` for the third tensor named `Qcur-3`),
//! written by tools/dump_llama_tensors.py with the same ids. Step 0 is the prompt `ID...`;
//! step s > 0 decodes the s-th id after `--`. `OP_DIFF_LAYER=n` prints layer n only.
//! Dense llama-style models only.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use strata_core::{Device, DeviceBuffer, Stream};
use strata_model::Model;
use strata_model::ops::Ops;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn read(dir: &Path, name: &str) -> Res<Vec<f32>> {
    let p = dir.join(format!("{name}.f32"));
    let b = std::fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    Ok(b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

struct Cmp {
    dev: Device,
    stream: Stream,
    dir: PathBuf,
    step: usize,
}

impl Cmp {
    fn want(&self, name: &str) -> Res<Vec<f32>> {
        read(&self.dir, &format!("s{}_{name}", self.step))
    }
    fn buf(&self, v: &[f32]) -> Res<DeviceBuffer<f32>> {
        let b = self.dev.alloc::<f32>(v.len().max(1))?;
        self.dev.upload(&b, v, self.stream)?;
        Ok(b)
    }
    fn get(&self, b: &DeviceBuffer<f32>, n: usize) -> Res<Vec<f32>> {
        Ok(self.dev.download_range(b, 0, n, self.stream)?.wait()?)
    }
    /// Prints max |got - want| (and how many differ) for `name`.
    fn check(&self, label: &str, got: &[f32], name: &str) -> Res<f32> {
        let want = self.want(name)?;
        let n = want.len().min(got.len());
        let (mut max, mut diff, mut scale) = (0f32, 0usize, 0f32);
        for (a, b) in got[..n].iter().zip(&want[..n]) {
            let d = (a - b).abs();
            if d > 0.0 {
                diff += 1;
            }
            max = max.max(d);
            scale = scale.max(b.abs());
        }
        println!(
            "s{} {label:<28} max|d| {max:.3e} (max|x| {scale:.3e}) differing {diff}/{n}",
            self.step
        );
        Ok(max)
    }
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        return Err("usage: op_diff MODEL.gguf DUMP_DIR ID... [-- DECODE_ID...]".into());
    }
    let gguf = Arc::new(strata_gguf::GgufFile::open(&args[1])?);
    let dir = PathBuf::from(&args[2]);
    let split = args.iter().position(|a| a == "--").unwrap_or(args.len());
    let prompt: Vec<u32> = args[3..split]
        .iter()
        .map(|s| s.parse())
        .collect::<Result<_, _>>()?;
    let decode: Vec<u32> = args[(split + 1).min(args.len())..]
        .iter()
        .map(|s| s.parse())
        .collect::<Result<_, _>>()?;
    let dev = strata_backend_cpu::device(strata_backend_cpu::CpuOptions::from_env())?;
    let stream = dev.main_stream();
    let model = Model::load(&dev, stream, gguf, |_, _| {})?;
    let h = model.hp.clone();
    let n_ctx = 512u32;
    let kvd = h.kv_dim() as usize;
    let k_cache: Vec<DeviceBuffer<u16>> = (0..h.n_layer)
        .map(|_| dev.alloc::<u16>(n_ctx as usize * kvd))
        .collect::<Result<_, _>>()?;
    let v_cache: Vec<DeviceBuffer<u16>> = (0..h.n_layer)
        .map(|_| dev.alloc::<u16>(n_ctx as usize * kvd))
        .collect::<Result<_, _>>()?;
    let only: Option<usize> = std::env::var("OP_DIFF_LAYER")
        .ok()
        .and_then(|s| s.parse().ok());
    let mut pos0 = 0u32;
    let mut steps = vec![prompt];
    steps.extend(decode.iter().map(|&t| vec![t]));
    for (step, toks) in steps.iter().enumerate() {
        let c = Cmp {
            dev: dev.clone(),
            stream,
            dir: dir.clone(),
            step,
        };
        let ops = Ops { dev: &dev, stream };
        let n = toks.len() as u32;
        let nu = n as usize;
        let e = h.n_embd as usize;
        let ids = dev.alloc::<u32>(nu)?;
        dev.upload(&ids, toks, stream)?;
        let positions: Vec<i32> = (0..n).map(|i| (pos0 + i) as i32).collect();
        let pos = dev.alloc::<i32>(nu)?;
        dev.upload(&pos, &positions, stream)?;
        let out = dev.alloc::<f32>(nu * h.n_vocab as usize)?;
        ops.embed_rows(&model.tok_embd, &ids, &out, n)?;
        c.check("embed", &c.get(&out, nu * e)?, "embd")?;
        for (il, layer) in model.layers.iter().enumerate() {
            let show = only.is_none_or(|l| l == il);
            let chk = |label: &str, got: &DeviceBuffer<f32>, len: usize, name: &str| -> Res<()> {
                if show {
                    c.check(&format!("{label}-{il}"), &c.get(got, len)?, name)?;
                }
                Ok(())
            };
            let x = if il == 0 {
                c.want("embd")?
            } else {
                c.want(&format!("l_out-{}", il - 1))?
            };
            let xb = c.buf(&x)?;
            let a = &layer.attn;
            ops.rms_norm(&xb, 0, &a.norm, &out, 0, n, h.rms_eps)?;
            chk("attn_norm", &out, nu * e, &format!("attn_norm-{il}"))?;
            let xn = c.buf(&c.want(&format!("attn_norm-{il}"))?)?;
            let qd = h.q_dim() as usize;
            ops.mul_mat(&a.wq, &xn, 0, &out, n)?;
            chk("Qcur", &out, nu * qd, &format!("Qcur-{il}"))?;
            ops.mul_mat(&a.wk, &xn, 0, &out, n)?;
            chk("Kcur", &out, nu * kvd, &format!("Kcur-{il}"))?;
            ops.mul_mat(&a.wv, &xn, 0, &out, n)?;
            chk("Vcur", &out, nu * kvd, &format!("Vcur-{il}"))?;
            let q = c.buf(&c.want(&format!("Qcur-{il}"))?)?;
            ops.rope(&q, &pos, n, h.n_head, h.head_dim, &h.rope)?;
            chk("rope Q", &q, nu * qd, &format!("Qcur-{il}_2"))?;
            let k = c.buf(&c.want(&format!("Kcur-{il}"))?)?;
            ops.rope(&k, &pos, n, h.n_head_kv, h.head_dim, &h.rope)?;
            chk("rope K", &k, nu * kvd, &format!("Kcur-{il}_2"))?;
            let q = c.buf(&c.want(&format!("Qcur-{il}_2"))?)?;
            let k = c.buf(&c.want(&format!("Kcur-{il}_2"))?)?;
            let v = c.buf(&c.want(&format!("Vcur-{il}"))?)?;
            ops.kv_store(
                &k,
                &v,
                &pos,
                (&k_cache[il]).into(),
                (&v_cache[il]).into(),
                kvd as u32,
                n,
                n_ctx,
            )?;
            ops.attention(
                &q,
                &pos,
                (&k_cache[il]).into(),
                (&v_cache[il]).into(),
                &out,
                n,
                h.n_head,
                h.n_head_kv,
                h.head_dim,
                n_ctx,
                h.attn_scale,
            )?;
            chk("attention", &out, nu * qd, &format!("kqv_out-{il}"))?;
            let att = c.buf(&c.want(&format!("kqv_out-{il}"))?)?;
            ops.mul_mat(&a.wo, &att, 0, &out, n)?;
            chk("wo", &out, nu * e, &format!("attn_out-{il}"))?;
            let ffn_inp = c.buf(&c.want(&format!("ffn_inp-{il}"))?)?;
            ops.rms_norm(&ffn_inp, 0, &layer.ffn_norm, &out, 0, n, h.rms_eps)?;
            chk("ffn_norm", &out, nu * e, &format!("ffn_norm-{il}"))?;
            let fx = c.buf(&c.want(&format!("ffn_norm-{il}"))?)?;
            let strata_model::model::Ffn::Dense { gate, up, down } = &layer.ffn else {
                return Err("dense FFN only".into());
            };
            let ff = gate.m as usize;
            ops.mul_mat(gate, &fx, 0, &out, n)?;
            chk("gate", &out, nu * ff, &format!("ffn_gate-{il}"))?;
            ops.mul_mat(up, &fx, 0, &out, n)?;
            chk("up", &out, nu * ff, &format!("ffn_up-{il}"))?;
            let g = c.buf(&c.want(&format!("ffn_gate-{il}"))?)?;
            let u = c.buf(&c.want(&format!("ffn_up-{il}"))?)?;
            ops.swiglu(&g, &u, &out, n * gate.m)?;
            chk("swiglu", &out, nu * ff, &format!("ffn_swiglu-{il}"))?;
            let sw = c.buf(&c.want(&format!("ffn_swiglu-{il}"))?)?;
            ops.mul_mat(down, &sw, 0, &out, n)?;
            chk("down", &out, nu * e, &format!("ffn_out-{il}"))?;
        }
        let last = c.buf(&c.want(&format!("l_out-{}", h.n_layer - 1))?)?;
        ops.rms_norm(&last, 0, &model.output_norm, &out, 0, n, h.rms_eps)?;
        c.check("result_norm", &c.get(&out, nu * e)?, "result_norm")?;
        let rn = c.buf(&c.want("result_norm")?)?;
        ops.mul_mat(model.output(), &rn, 0, &out, n)?;
        c.check(
            "output",
            &c.get(&out, nu * h.n_vocab as usize)?,
            "result_output",
        )?;
        pos0 += n;
    }
    Ok(())
}
