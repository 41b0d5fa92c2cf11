//! One module per `strata` subcommand.

pub mod bench;
pub mod chat;
pub mod common;
pub mod devices;
pub mod experts;
pub mod info;
pub mod kv_grow;
pub mod perplexity;
pub mod profile;
pub mod run;
pub mod serve;
pub mod spec;
pub mod synth;
pub mod template;
pub mod tokenize;
