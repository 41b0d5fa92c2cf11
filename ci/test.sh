#!/usr/bin/env bash
# The whole test suite, as CI runs it: formatting, lints, every test with the CPU
# sanitizer on, and the CUDA and HIP builds (which need no GPU software installed).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
# CI's disk is shared and has run out (stop 19: the linker died with a bus error, then
# "No space left on device"). Line tables keep panics' file:line; full debug info and the
# incremental cache only make the target directory bigger, of no use to a one-shot run (a
# clean run with these settings peaked at 2.1 GB here).
export CARGO_INCREMENTAL=0
export CARGO_PROFILE_DEV_DEBUG=line-tables-only
export CARGO_PROFILE_TEST_DEBUG=line-tables-only
echo "== disk: $(df -h . | awk 'NR==2 {print $4 " free of " $2}')"
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
cargo clippy --workspace --all-targets --features cuda,hip -- -D warnings
echo "== models"
export STRATA_SMOLLM2="$(./ci/fetch-models.sh)"
echo "== cargo test (STRATA_SANITIZE=1)"
STRATA_SANITIZE=1 cargo test --workspace
echo "== cargo build --features cuda,hip (no GPU software needed to build)"
cargo build --features cuda,hip
cargo run -q -p strata-cli --features cuda,hip -- devices
echo "== the official openai Python client against strata serve (started on a free port, stopped by SIGTERM)"
python3 -c 'import openai, sys; sys.exit(openai.__version__ != "3.51.0")' 2>/dev/null \
  || python3 -m pip install -q "openai==3.51.0"
# The test profile (opt-level 1, the libraries already built by `cargo test`): the load test
# streams 16 clients at once, which the unoptimised dev kernels would take minutes over.
cargo build -q --profile test -p strata-cli
python3 tests/openai_client.py --serve "${CARGO_TARGET_DIR:-target}/debug/strata" --model "$STRATA_SMOLLM2"
