//! `strata`: run Mixture-of-Experts GGUF models on a GPU smaller than the model.

mod commands;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "strata", version, about = "Mixture-of-Experts inference for GPUs smaller than the model")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// One variant per command; each command lives in its own file under commands/.
#[derive(Subcommand)]
enum Command {
    /// List the backends compiled in and the devices they find, with memory.
    Devices(commands::devices::Args),
    /// What a GGUF file holds, and how many experts would fit in VRAM.
    Info(commands::info::Args),
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
        Command::Info(args) => commands::info::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("strata: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
