#!/usr/bin/env bash
# One call on the GPU machine: build llama.cpp (CUDA, sm_90) in the background, run the
# CUDA test binaries, profile strata's decode per kernel, then ci/bench-gpu.sh against
# llama.cpp. Expects .carry/ from this machine: strata (release, --features cuda),
# cuda2/{conformance,model_ops,model_logits} test binaries, llama.tgz and llama-cpp.sh
# (../shared/oracle). Everything lands in $OUT; a short summary is printed last.
#
#   STEPS="tests profile bench-Q4_K offload bench-IQ2_XS" QUANTS="Q4_K IQ2_XS" \
#     PROFILE_QUANTS=Q4_K bash tools/cuda_session.sh
# LLAMA=0 skips llama.cpp (a strata-only look: the profile step also runs strata bench).
set -u
C=${CARRY:-$PWD/.carry}
OUT=${OUT:-/tmp/strata-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=/usr/local/cuda/bin:$PATH
export RUST_BACKTRACE=1
STEPS=${STEPS:-tests profile bench-Q4_K}
QUANTS=${QUANTS:-Q4_K IQ2_XS}
MODEL_DIR=/tmp/strata-bench
mkdir -p "$MODEL_DIR"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }

if [ "${LLAMA:-1}" = 1 ] && [ ! -x /tmp/lc/llama.cpp/build/bin/llama-bench ]; then
  (bash "$C/llama-cpp.sh" build-cuda "$C/llama.tgz" /tmp/lc > "$OUT/llama-build.log" 2>&1;
   echo "exit $?" >> "$OUT/llama-build.log") &
  LLAMA_PID=$!
fi

case " $STEPS " in *" tests "*)
  for t in conformance model_ops model_logits; do
    [ -x "$C/cuda2/$t" ] || continue
    f=""; [ "$t" = conformance ] && f=${CONFORMANCE_FILTER:-}
    timeout 300 "$C/cuda2/$t" --test-threads=1 $f > "$OUT/test-$t.txt" 2>&1
    stamp "test $t: $(grep -E '^test result' "$OUT/test-$t.txt" | tail -1)"
    grep -q "^test result: ok" "$OUT/test-$t.txt" || grep -E -A12 "^---- |panicked" "$OUT/test-$t.txt" | head -60
  done;;
esac

for q in $QUANTS; do
  f="$MODEL_DIR/qwen3-30b-a3b-shape-$q.gguf"
  if [ ! -f "$f" ]; then
    "$C/strata" synth --arch qwen3moe --layers 48 --hidden 2048 --heads 32 --kv-heads 4 \
      --head-dim 128 --experts 128 --experts-used 8 --expert-ffn 768 --vocab 151936 \
      --quant "$q" --seed 1 -o "$f" > "$OUT/synth-$q.txt" 2>&1
    stamp "synth $q: $(tail -1 "$OUT/synth-$q.txt")"
  fi
done

case " $STEPS " in *" profile "*)
  for q in ${PROFILE_QUANTS:-$QUANTS}; do
    f="$MODEL_DIR/qwen3-30b-a3b-shape-$q.gguf"
    # Per kernel inside one replayed decode graph (event-record nodes), at depth 0 and 512;
    # then throughput (tg from an empty context, as llama-bench) and decode at depth 4096.
    STRATA_KERNEL_TIMING=1 "$C/strata" bench -m "$f" --backend cuda -p 0 -n 32 \
      > "$OUT/profile-$q.txt" 2>&1
    STRATA_KERNEL_TIMING=1 "$C/strata" bench -m "$f" --backend cuda -p 0 -d 512 -n 32 \
      > "$OUT/profile-ctx512-$q.txt" 2>&1
    "$C/strata" bench -m "$f" --backend cuda -p 512 -n 128 -r 2 >> "$OUT/profile-$q.txt" 2>&1
    "$C/strata" bench -m "$f" --backend cuda -p 0 -d 4096 -n 64 >> "$OUT/profile-$q.txt" 2>&1
    stamp "profile $q done"
  done;;
esac

NCU_METRICS=gpu__time_duration.sum,dram__bytes_read.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__block_size,launch__registers_per_thread
ncu_run() {  # ncu_run NAME COMMAND...: every kernel launch (graph nodes one by one), CSV
  local name=$1; shift
  timeout 240 ncu --clock-control none --graph-profiling node --print-units base --csv \
    --metrics "$NCU_METRICS" --launch-count "$NCU_LAUNCHES" "$@" > "$OUT/ncu-$name.csv" 2> "$OUT/ncu-$name.log"
  python3 "${NCU_SUMMARY:-$C/ncu_summary.py}" "$OUT/ncu-$name.csv" --last "${NCU_LAST:-0}" > "$OUT/ncu-$name.txt" 2>&1
  stamp "ncu $name: $(head -1 "$OUT/ncu-$name.txt")"
}
case " $STEPS " in *" ncu "*)
  f="$MODEL_DIR/qwen3-30b-a3b-shape-Q4_K.gguf"
  NCU_LAUNCHES=1800 ncu_run strata "$C/strata" bench -m "$f" --backend cuda -p 0 -n 2;;
esac

[ -n "${LLAMA_PID:-}" ] && wait "$LLAMA_PID"
stamp "llama.cpp build: $(tail -1 "$OUT/llama-build.log" 2>/dev/null)"
LLAMA_BIN=/tmp/lc/llama.cpp/build/bin
case " $STEPS " in *" ncu "*)
  [ -x $LLAMA_BIN/llama-bench ] && NCU_LAUNCHES=3000 ncu_run llama "$LLAMA_BIN/llama-bench" \
    -m "$MODEL_DIR/qwen3-30b-a3b-shape-Q4_K.gguf" -ngl 99 -fa 1 -p 0 -n 1 -r 1;;
esac
for step in $STEPS; do
  case $step in
    bench-*)
      q=${step#bench-}
      STRATA="$C/strata" LLAMA_BIN=$LLAMA_BIN MODEL_DIR="$MODEL_DIR" OUT="$OUT/bench" \
        REPS=${REPS:-2} bash ci/bench-gpu.sh "$q" > "$OUT/bench-table-$q.md" 2> "$OUT/bench-$q.log"
      stamp "bench $q done";;
    kvdepth)
      # f16 at 4K and 32K, int8 at 4K (KVDEPTH_F16 / KVDEPTH_INT8 to change)
      for kv in f16 int8; do
        [ $kv = f16 ] && d=${KVDEPTH_F16:-4096 32768} || d=${KVDEPTH_INT8:-4096}
        STRATA="$C/strata" LLAMA_BIN=$LLAMA_BIN MODEL_DIR="$MODEL_DIR" OUT="$OUT/kvdepth" \
          KVS=$kv DEPTHS="$d" bash ci/bench-kv-depth.sh >> "$OUT/kvdepth-table.md" 2>> "$OUT/kvdepth.log"
      done
      stamp "kv depth done";;
    prefill-profile)
      STRATA_KERNEL_TIMING=1 "$C/strata" bench -m "$MODEL_DIR/qwen3-30b-a3b-shape-Q4_K.gguf" \
        --backend cuda -p 512 -n 0 > "$OUT/prefill-profile.txt" 2>&1
      stamp "prefill profile done";;
    offload)
      STRATA="$C/strata" LLAMA_BIN=$LLAMA_BIN MODEL_DIR="$MODEL_DIR" OUT="$OUT/offload" \
        REPS=${OFFLOAD_REPS:-2} bash ci/bench-offload.sh > "$OUT/offload-table.md" 2> "$OUT/offload.log"
      stamp "offload done";;
  esac
done

echo "== summary"
for n in strata llama; do [ -f "$OUT/ncu-$n.txt" ] && head -22 "$OUT/ncu-$n.txt"; done
for q in $QUANTS; do
  [ -f "$OUT/profile-$q.txt" ] && grep -E "decode profile|^(kernel|mul_mat|attention|rms_norm|router|rope|add|swiglu|kv_store|embed|moe|sigmoid)|^tg" "$OUT/profile-$q.txt" | head -24
done
cat "$OUT"/bench-table-*.md 2>/dev/null
cat "$OUT/offload-table.md" 2>/dev/null
cat "$OUT/kvdepth-table.md" 2>/dev/null
[ -f "$OUT/prefill-profile.txt" ] && grep -A16 "profile" "$OUT/prefill-profile.txt" | head -24
tail -3 "$OUT"/bench-*.log "$OUT/offload.log" 2>/dev/null | grep -v INFO
