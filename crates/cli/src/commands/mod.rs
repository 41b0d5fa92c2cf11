//! One module per `strata` subcommand.

pub mod devices;
pub mod info;
