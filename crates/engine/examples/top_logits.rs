//! Prints the top-3 logits at each greedy step for given prompt token ids: a quick way to
//! compare against llama.cpp by eye. `top_logits MODEL.gguf STEPS ID ID ...`

use std::sync::Arc;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        return Err("usage: top_logits MODEL.gguf STEPS ID...".into());
    }
    let gguf = Arc::new(strata_gguf::GgufFile::open(&args[1])?);
    let steps: usize = args[2].parse()?;
    let ids: Vec<u32> = args[3..]
        .iter()
        .map(|s| s.parse())
        .collect::<Result<_, _>>()?;
    let dev = strata_backend_cpu::device(strata_backend_cpu::CpuOptions::from_env())?;
    let model = Arc::new(strata_model::Model::load(
        &dev,
        dev.main_stream(),
        gguf,
        |_, _| {},
    )?);
    let mut ctx = strata_engine::Context::new(model, dev, 512, 512)?;
    let mut logits = ctx.eval(&ids)?;
    for i in 0..steps {
        let mut idx: Vec<usize> = (0..logits.len()).collect();
        idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        let top: Vec<(usize, f32)> = idx[..3].iter().map(|&j| (j, logits[j])).collect();
        println!("{i} {} {top:?}", idx[0]);
        logits = ctx.eval(&[idx[0] as u32])?;
    }
    Ok(())
}
