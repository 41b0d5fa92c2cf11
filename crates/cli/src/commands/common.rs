//! What every model-running command shares: the model file, the backend, the context.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use strata_core::{Device, KernelId};
use strata_gguf::GgufFile;
use strata_model::chat::{ChatInputs, ChatTemplate};
use strata_model::tokenizer::{Tokenizer, TokenizerSpec};
use strata_model::{KvFormat, Model};

#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// The GGUF model file.
    #[arg(short = 'm', long = "model")]
    pub model: PathBuf,
    /// cpu, cuda or hip (default: the best backend that runs every kernel of the model).
    #[arg(long)]
    pub backend: Option<String>,
    /// GPU ordinal for GPU backends.
    #[arg(long, default_value_t = 0)]
    pub gpu: usize,
    /// Context length in tokens (default: the model's, capped at 4096); checked against
    /// memory at start-up.
    #[arg(long = "ctx", short = 'c', visible_alias = "max-context")]
    pub ctx: Option<u32>,
    /// K/V cache format: f16, or int8 (ggml's q8_0 blocks: 32 int8 values and an f16
    /// scale, 53% of f16's bytes).
    #[arg(long = "kv", default_value = "f16", value_parser = parse_kv)]
    pub kv: KvFormat,
    /// Most tokens fed per forward pass.
    #[arg(long = "batch", short = 'b', default_value_t = 512)]
    pub batch: u32,
    /// Most tokens per forward pass within a batch (default on the CPU, whose resident
    /// scratch grows with it: 64 for a dense model, more for an MoE one whose experts
    /// each see a part of the pass, at most 192; the whole batch elsewhere). Same results.
    #[arg(long = "ubatch")]
    pub ubatch: Option<u32>,
    #[command(flatten)]
    pub experts: super::experts::ExpertArgs,
}

/// The CPU's default micro-batch gives every weight matrix about this many tokens a pass:
/// a dense model's matrices each see the whole pass, an MoE expert about used / experts
/// of it. SmolLM2's prefill took the same CPU time in passes of 32 to 192 tokens, while
/// its resident scratch grows ~36 KB a token (6 MB at 192, beside a 98 MB file).
const CPU_TOKENS_PER_MATRIX: u32 = 64;

/// The CPU's largest default micro-batch: MoE prefill was 4% slower at 256 and 8% at
/// 128 than whole 512-token batches (synthetic qwen3moe bench file, 24 tokens an expert
/// at 192; its scratch ~70 KB a token).
const CPU_MAX_UBATCH: u32 = 192;

impl ModelArgs {
    /// The micro-batch of contexts of `loaded`: `--ubatch`, else the backend's default.
    pub fn micro_batch(&self, loaded: &Loaded) -> u32 {
        self.ubatch.unwrap_or(match loaded.dev.info().backend {
            strata_core::BackendKind::Cpu => {
                let spread = loaded
                    .model
                    .hp
                    .moe
                    .as_ref()
                    .map_or(1, |m| m.n_expert / m.n_expert_used.max(1));
                CPU_TOKENS_PER_MATRIX
                    .saturating_mul(spread.max(1))
                    .min(CPU_MAX_UBATCH)
            }
            _ => self.batch,
        })
    }
}

fn parse_kv(s: &str) -> Result<KvFormat, String> {
    KvFormat::parse(s).ok_or_else(|| format!("`{s}`: the K/V formats are f16 and int8"))
}

pub struct Loaded {
    pub dev: Device,
    pub model: Arc<Model>,
    pub tokenizer: Tokenizer,
    pub n_ctx: u32,
    pub kv: KvFormat,
    /// The expert cache, when the routed experts are not all on the device; every
    /// context of the model runs them through it (`experts::attach`).
    pub experts: Option<strata_engine::experts::SharedExpertCache>,
}

fn cpu_device() -> anyhow::Result<Device> {
    Ok(strata_backend_cpu::device(
        strata_backend_cpu::CpuOptions::from_env(),
    )?)
}

#[cfg(feature = "cuda")]
fn cuda_device(ordinal: usize) -> anyhow::Result<Device> {
    Ok(strata_backend_cuda::device(ordinal)?)
}

#[cfg(not(feature = "cuda"))]
fn cuda_device(_ordinal: usize) -> anyhow::Result<Device> {
    bail!("this strata was built without CUDA (rebuild with --features cuda)")
}

#[cfg(feature = "hip")]
fn hip_device(ordinal: usize) -> anyhow::Result<Device> {
    Ok(strata_backend_hip::device(ordinal)?)
}

#[cfg(not(feature = "hip"))]
fn hip_device(_ordinal: usize) -> anyhow::Result<Device> {
    bail!("this strata was built without HIP (rebuild with --features hip)")
}

/// Whether `dev` has every kernel a forward pass launches.
fn runs_models(dev: &Device) -> bool {
    KernelId::ALL
        .iter()
        .filter(|k| k.module() == "model")
        .all(|k| dev.supports(*k))
}

pub fn device(backend: Option<&str>, gpu: usize) -> anyhow::Result<Device> {
    match backend {
        Some("cpu") => cpu_device(),
        Some("cuda") => {
            let dev = cuda_device(gpu)?;
            if !runs_models(&dev) {
                bail!("the CUDA backend does not have the model kernels yet; use --backend cpu");
            }
            Ok(dev)
        }
        Some("hip") => {
            let dev = hip_device(gpu)?;
            if !runs_models(&dev) {
                bail!("the HIP backend does not have the model kernels yet; use --backend cpu");
            }
            Ok(dev)
        }
        Some(other) => bail!("unknown backend `{other}` (cpu, cuda, hip)"),
        None => {
            if let Ok(dev) = cuda_device(gpu)
                && runs_models(&dev)
            {
                return Ok(dev);
            }
            if let Ok(dev) = hip_device(gpu)
                && runs_models(&dev)
            {
                return Ok(dev);
            }
            cpu_device()
        }
    }
}

pub fn load(args: &ModelArgs) -> anyhow::Result<Loaded> {
    load_for(args, 1)
}

/// Refuses a context that does not fit: `contexts` K/V caches of `n_ctx` positions in
/// `format` must fit the memory left after the model (and the expert cache), less
/// `reserve` bytes; the error says how many positions would.
fn check_kv_fits(
    dev: &Device,
    model: &Model,
    n_ctx: u32,
    format: KvFormat,
    contexts: usize,
    reserve: u64,
) -> anyhow::Result<()> {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let contexts = contexts.max(1) as u64;
    let need = format.bytes_for(model, u64::from(n_ctx)) * contexts;
    let free = (dev.memory()?.free as u64).saturating_sub(reserve);
    if need <= free {
        return Ok(());
    }
    let per_position = format.bytes_for(model, 1) * contexts;
    let fits = free / per_position.max(1);
    let other = match format {
        KvFormat::F16 => KvFormat::Int8,
        KvFormat::Int8 => KvFormat::F16,
    };
    let other_fits = free / (other.bytes_for(model, 1) * contexts).max(1);
    let alt = if other.check(model.hp.head_dim).is_ok() {
        format!(", {other_fits} with --kv {other}")
    } else {
        String::new()
    };
    bail!(
        "a context of {n_ctx} positions needs {:.2} GiB of {format} K/V{}; {:.2} GiB is free after the model and the {} MiB reserve: at most {fits} positions fit{alt} (--ctx N)",
        gib(need),
        if contexts > 1 {
            format!(" for {contexts} contexts")
        } else {
            String::new()
        },
        gib(free),
        reserve >> 20
    )
}

/// [`load`] for a command that holds `contexts` contexts at once (the server's
/// `--parallel`).
pub fn load_for(args: &ModelArgs, contexts: usize) -> anyhow::Result<Loaded> {
    load_elastic(args, contexts, None)
}

/// [`load_for`] whose contexts start with `kv_cells` K/V cells each (elastic K/V: its
/// growth is checked against free memory as it happens), not the whole context.
pub fn load_elastic(
    args: &ModelArgs,
    contexts: usize,
    kv_cells: Option<u32>,
) -> anyhow::Result<Loaded> {
    let gguf = Arc::new(
        GgufFile::open(&args.model).with_context(|| format!("opening {}", args.model.display()))?,
    );
    let tokenizer = Tokenizer::from_spec(&TokenizerSpec::from_gguf(&gguf)?)
        .context("building the tokenizer")?;
    let dev = device(args.backend.as_deref(), args.gpu)?;
    let bar = indicatif::ProgressBar::new(0).with_style(
        indicatif::ProgressStyle::with_template("loading {bar:30} {pos}/{len} layers {elapsed}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    let stream = dev.main_stream();
    let hp = strata_model::arch::hparams(&gguf)?;
    let n_ctx = args.ctx.unwrap_or(hp.n_ctx_train.min(4096)).max(1);
    args.kv.check(hp.head_dim)?;
    let kv_bytes = kv_bytes_for(&hp, n_ctx, args.kv) * contexts.max(1) as u64;
    let placement = args.experts.placement(&gguf, &dev, kv_bytes)?;
    let opts = strata_model::LoadOptions {
        experts_on_device: placement == super::experts::Placement::Device,
    };
    let model = Model::load_with(&dev, stream, gguf, opts, |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })?;
    bar.finish_and_clear();
    let experts = match placement {
        super::experts::Placement::Device => None,
        super::experts::Placement::Cache(n) => Some(args.experts.cache(&dev, &model, n)?),
    };
    let reserve = args.experts.vram_reserve_mib << 20;
    let cells = kv_cells.map_or(n_ctx, |c| c.min(n_ctx));
    check_kv_fits(&dev, &model, cells, args.kv, contexts, reserve)?;
    tracing::info!(
        "{}: {} layers, {} embedding, {} vocab on {} ({})",
        model.hp.arch,
        model.hp.n_layer,
        model.hp.n_embd,
        model.hp.n_vocab,
        dev.info().name,
        dev.info().backend.name()
    );
    Ok(Loaded {
        dev,
        model: Arc::new(model),
        tokenizer,
        n_ctx,
        kv: args.kv,
        experts,
    })
}

/// Device bytes of one context's K/V (the model's shape from its hyper-parameters).
pub fn kv_bytes_for(hp: &strata_model::HParams, n_ctx: u32, format: KvFormat) -> u64 {
    let row = format.row_words(hp.kv_dim() as usize) as u64 * 2;
    2 * u64::from(hp.n_layer) * row * u64::from(n_ctx)
}

/// Sampling flags shared by run, chat and serve defaults.
#[derive(clap::Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Temperature; 0 is greedy.
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temperature: f32,
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Random seed (default: from the clock).
    #[arg(long)]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    pub fn params(&self) -> strata_engine::SamplingParams {
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
        strata_engine::SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            penalty_last_n: self.repeat_last_n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed,
        }
    }
}

/// The prompt tokens of a chat: the model's template rendered with a generation prompt,
/// tokenized with control tokens recognised (and one BOS, not two).
pub fn chat_tokens(tok: &Tokenizer, messages: &[(&str, &str)]) -> anyhow::Result<Vec<u32>> {
    let text = render_chat(tok, messages)?;
    tracing::debug!("chat prompt: {text:?}");
    Ok(strata_model::chat::encode_chat(tok, &text)?)
}

/// The conversation rendered by the model's `tokenizer.chat_template` with a generation
/// prompt, BOS/EOS texts from the vocabulary.
pub fn render_chat(tok: &Tokenizer, messages: &[(&str, &str)]) -> anyhow::Result<String> {
    let Some(source) = tok.chat_template() else {
        bail!("the model has no chat template (tokenizer.chat_template); use --raw");
    };
    let list: Vec<serde_json::Value> = messages
        .iter()
        .map(|(role, content)| serde_json::json!({"role": role, "content": content}))
        .collect();
    let mut inputs = ChatInputs::from_json(&serde_json::Value::from(list).to_string(), None)?
        .with_special_texts(tok);
    inputs.add_generation_prompt = true;
    Ok(ChatTemplate::new(source)?.render(&inputs)?)
}
