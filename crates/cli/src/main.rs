//! `strata`: run Mixture-of-Experts GGUF models on a GPU smaller than the model.

mod commands;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "strata",
    version,
    about = "Mixture-of-Experts inference for GPUs smaller than the model"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// One variant per command; each command lives in its own file under commands/.
#[derive(Subcommand)]
enum Command {
    /// List the backends compiled in and the devices they find, with memory.
    Devices(commands::devices::Args),
    /// Answer one prompt (chat template applied unless --raw).
    Run(commands::run::Args),
    /// An interactive, multi-turn conversation.
    Chat(commands::chat::Args),
    /// Prefill and decode speed (tokens/s).
    Bench(commands::bench::Args),
    /// What a GGUF file holds, and how many experts would fit in VRAM.
    Info(commands::info::Args),
    /// Token ids of a text (as llama-tokenize --ids prints them).
    Tokenize(commands::tokenize::Args),
    /// Render a conversation through the model's chat template.
    Template(commands::template::Args),
    /// An OpenAI-compatible HTTP server (chat completions, completions, models).
    Serve(commands::serve::Args),
    /// Write a random-weight GGUF model of a given architecture, shape and format.
    Synth(commands::synth::Args),
    /// Routing counts per (layer, expert) over a file of prompts, for --profile.
    Profile(commands::profile::Args),
    /// Perplexity of the model on a text (as llama-perplexity computes it).
    Perplexity(commands::perplexity::Args),
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("STRATA_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Devices(args) => commands::devices::run(args),
        Command::Run(args) => commands::run::run(args),
        Command::Chat(args) => commands::chat::run(args),
        Command::Bench(args) => commands::bench::run(args),
        Command::Info(args) => commands::info::run(args),
        Command::Tokenize(args) => commands::tokenize::run(args),
        Command::Template(args) => commands::template::run(args),
        Command::Synth(args) => commands::synth::run(args),
        Command::Serve(args) => commands::serve::run(args),
        Command::Profile(args) => commands::profile::run(args),
        Command::Perplexity(args) => commands::perplexity::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("strata: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
