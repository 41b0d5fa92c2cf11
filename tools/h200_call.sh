#!/usr/bin/env bash
# One device call on the H200 machine from .carry/h200 (tools/h200_build_carry.sh): the
# steps named, in order, within LIMIT seconds (default 570); each step's output goes to
# /tmp/logs/<step>.txt and all of them to $OUT/logs.tgz (a call returns at most 8 files).
#   bash tools/h200_call.sh tests synth profile llama kt-att window     (first call)
#   bash tools/h200_call.sh depth                                        (the next, warm)
# Steps: tests (the CUDA test binaries, first and alone: a cold NVRTC compile under a
# llama.cpp build took over 150 s a binary), synth (the skewed Qwen3-30B-A3B-shaped Q4_K file
# into /dev/shm), profile (strata profile of 16 random prompts), llama (build llama.cpp in the
# background; later steps that need it wait), offload (ci/bench-offload.sh), depth
# (ci/bench-kv-depth.sh at a 50% cache; DEPTHS, KVS), window (ci/bench-spec-window.sh K=4 at
# a 50% cache), kt-att / kt-win (per-kernel profiles at 32K / of a window), pool (pool_timing
# at 16 and 8 threads), kcache, sweep (SWEEP: kernel-cache variants at SWEEP_DEPTH), quick (two test binaries on
# the cached kernels; QUICK names them), cb (cuda_backend: compiles every module cold in a folder of its own),
# unpack (the xz-packed binaries of BUNDLE=1), stash / smol / smol-spec (SmolLM2 carried in
# pieces, tools/h200_smol_parts.sh: its GPU logits test; ci/bench-spec.sh with llama.cpp's
# n-gram and draft-model modes), ncu / ncu-llama (Nsight Compute on the products), window-norows
# (window without mul_mat_vec_q8_rows), window-qkv3 / window-qkvbase (window's Q, K, V as
# three mul_mat / the base mul_mat_qkv instead of mul_mat_qkv_q8_rows), window-noq8 (window without
# mul_mat_experts_cached_multi_q8), tg-sweep (TG_SWEEP: decode per kernel-cache variant),
# smol-diag (SmolLM2's window cost with graphs on/off), gpu (ci/bench-gpu.sh Q4_K), ncu-win (a
# window's own kernels under Nsight Compute), window-skip (window with WSKIP's variants left out),
# window-res / kt-win-res (the window and its per-kernel profile with every expert on the device),
# window-res-grid (window-grid's variants with every expert on the device), window-env (the
# cache's window with and without WENV, a measuring switch), window-threads (the cache's window
# at each CPU pool size of WTHREADS). LLAMA=0: depth
# runs strata alone.
# A warm machine (30 s idle) keeps /dev/shm and /tmp between calls.
set -u
C=$PWD/.carry/h200
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 PATH=/usr/local/cuda/bin:$PATH RUST_BACKTRACE=1
S=$C/strata D=/dev/shm/sb L=/tmp/logs LB=/tmp/lc/llama.cpp/build/bin
F=$D/qwen3-30b-a3b-shape-Q4_K-skew1.0.gguf P=$D/profile.json
SD=/dev/shm/smol SM=/dev/shm/smol/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p "$D" "$L"
T0=$(date +%s)
trap 'tar czf "${OUT:-/tmp}/logs.tgz" -C /tmp logs 2>/dev/null' EXIT
stamp() { echo "[$(($(date +%s) - T0))s] $*"; }
left() { echo $((${LIMIT:-570} - ($(date +%s) - T0))); }
# run NAME TIMEOUT CMD...: output to $L/NAME.txt; prints the lines that matter
run() {
  local name=$1 to=$2; shift 2
  [ "$(left)" -lt 15 ] && { stamp "SKIP $name (time)"; return; }
  [ "$to" -gt "$(left)" ] && to=$(left)
  timeout "$to" "$@" > "$L/$name.txt" 2>&1
  stamp "$name rc=$?"
  grep -E "tokens/s|hit rate|test result|window|profile:|^attention|^mul_mat_experts|^\| (f16|int8)|^\| K|^\| [0-9]|^\| Q4_K|panicked|error" "$L/$name.txt" | head -12
}
# win NAME THREADS [VAR=VALUE ...]: the 50% cache window (K=4, REPS=2) with that CPU pool
# size and environment; prints its row
win() {
  local name=$1 th=$2; shift 2
  run "$name" 90 env "$@" STRATA="$S" BACKEND=cuda EXPERT_CACHE=3072 KS=4 REPS=2 \
    EXTRA="--profile $P --cpu-threads $th" bash "$C/bench-spec-window.sh" "$F" | grep -E "^\| 4"
}
wait_llama() { [ -n "${LP:-}" ] && wait "$LP"; [ -x "$LB/llama-bench" ] || { stamp "no llama.cpp build"; return 1; }; }
DEF=router_matvec_topk,experts_down_norm,mul_mat_experts_q8,mul_mat_experts_cached_grouped
NOROWS=$DEF,mul_mat_vec_q8_rows
NOQ8=$DEF,mul_mat_experts_cached_multi_q8
QKV3=$DEF,mul_mat_qkv QKVBASE=$DEF,mul_mat_qkv_q8_rows
B="$S bench -m $F --backend cuda --cpu-threads 16 --profile $P --expert-cache 3072"
for step in "$@"; do
  case $step in
    tests) for t in cuda_backend model_ops matvec_q8 qkv_q8 experts_cached_multi attention_flash attention_short model_logits; do
             [ -x "$C/$t" ] && run "test-$t" 300 "$C/$t" --test-threads=1; done ;;
    synth) [ -f "$F" ] || run synth 120 "$S" synth --arch qwen3moe --layers 48 --hidden 2048 --heads 32 \
             --kv-heads 4 --head-dim 128 --experts 128 --experts-used 8 --expert-ffn 768 --vocab 151936 \
             --quant Q4_K --router-skew 1.0 --seed 1 -o "$F" ;;
    profile) python3 -c "
import random
random.seed(7)
w = 'the of and to in is was for on that with as by at from his her it an are were which this'.split()
for _ in range(16): print(' '.join(random.choice(w) for _ in range(200)))" > "$D/prompts.txt"
             run profile 120 "$S" profile -m "$F" --backend cuda --raw --prompts "$D/prompts.txt" -n 32 \
               --cpu-threads 16 -o "$P" ;;
    llama) [ -x "$LB/llama-bench" ] || { (nice -n 19 bash "$C/llama-cpp.sh" build-cuda "$C/llama.tgz" /tmp/lc \
             > "$L/llama-build.txt" 2>&1) & LP=$!; } ;;
    gpu) # ci/bench-gpu.sh (issue 6: everything resident, pp512 / pp4096 / tg128, both engines)
         wait_llama && run gpu 300 env STRATA="$S" LLAMA_BIN="$LB" MODEL_DIR="$D/gpu" REPS="${GPU_REPS:-1}" \
           bash ci/bench-gpu.sh Q4_K ;;
    offload) wait_llama && run offload 420 env STRATA="$S" LLAMA_BIN="$LB" MODEL_DIR="$D" OUT="$L/off" REPS=1 \
               THREADS=16 STRATA_ARGS="${STRATA_ARGS:---stream-experts auto}" bash "$C/bench-offload.sh" ;;
    depth) # DEPTH_RUNS ("int8:32768 f16:131072"; default every KVS x DEPTHS): a bench-kv-depth run each
           runs=${DEPTH_RUNS:-$(for kv in ${KVS:-f16 int8}; do for d in ${DEPTHS:-4096 32768}; do printf '%s:%s ' "$kv" "$d"; done; done)}
           { [ "${LLAMA:-1}" = 0 ] || wait_llama; } && for r in $runs; do
             kv=${r%%:*} d=${r#*:}
             run "depth-$kv-$d" "$(left)" env STRATA="$S" LLAMA_BIN="$LB" MODEL_DIR="$D" OUT="$L/depth-$kv-$d" \
               DEPTHS="$d" KVS="$kv" LLAMA_ARGS="--n-cpu-moe 22 -t 16 ${LLAMA_EXTRA:-}" \
               STRATA_ARGS="--expert-cache 3072 --profile $P --cpu-threads 16" bash "$C/bench-kv-depth.sh" "$F"
           done ;;
    window) run window 120 env STRATA="$S" BACKEND=cuda EXPERT_CACHE=3072 KS=4 REPS=3 \
              EXTRA="--profile $P --cpu-threads 16" bash "$C/bench-spec-window.sh" "$F" ;;
    window-norows) # the same without mul_mat_vec_q8_rows (the tiled mul_mat takes the windows)
              run window-norows 120 env STRATA_CUDA_SKIP="$NOROWS" STRATA="$S" BACKEND=cuda EXPERT_CACHE=3072 KS=4 \
                REPS=3 EXTRA="--profile $P --cpu-threads 16" bash "$C/bench-spec-window.sh" "$F" ;;
    window-qkv3|window-qkvbase) # a window's Q, K, V as three mul_mat (main's; mul_mat_qkv left out,
              # decode keeps mul_mat_qkv_rope) / as the base mul_mat_qkv's per-token units
              [ "$step" = window-qkv3 ] && sk=$QKV3 || sk=$QKVBASE
              run "$step" 120 env STRATA_CUDA_SKIP="$sk" STRATA="$S" BACKEND=cuda EXPERT_CACHE=3072 KS=4 \
                REPS=3 EXTRA="--profile $P --cpu-threads 16" bash "$C/bench-spec-window.sh" "$F" ;;
    window-skip) # the same with WSKIP (comma-separated variants) left out besides the defaults
              run window-skip 120 env STRATA_CUDA_SKIP="$DEF,${WSKIP:-}" STRATA="$S" BACKEND=cuda EXPERT_CACHE=3072 KS=4 \
                REPS=3 EXTRA="--profile $P --cpu-threads 16" bash "$C/bench-spec-window.sh" "$F" ;;
    window-env) # the 50% cache window as is, then with WENV (VAR=VALUE: a measuring switch),
              # alternating, ENV_ROUNDS rounds of REPS=2
              for r in $(seq "${ENV_ROUNDS:-2}"); do
                win "window-env-$r-" 16
                # shellcheck disable=SC2086
                win "window-env-$r-${WENV%%=*}" 16 ${WENV:-}
              done ;;
    window-threads) # the 50% cache window at each pool size of WTHREADS (--cpu-threads; default
              # "16 15"), alternating, ENV_ROUNDS rounds of REPS=2
              for r in $(seq "${ENV_ROUNDS:-2}"); do
                for t in ${WTHREADS:-16 15}; do win "window-threads-$r-$t" "$t"; done
              done ;;
    window-res-grid) # window-grid with every expert on the device (no cache)
              i=0; for v in ${WIN_KC:-default}; do
                i=$((i + 1)); defs=$(cat "/tmp/kc/$v/DEFINES" 2>/dev/null)
                run "window-res-$i-$v" 90 env STRATA_CACHE_DIR="/tmp/kc/$v" STRATA_NVRTC_DEFINES="$defs" \
                  STRATA="$S" BACKEND=cuda KS=4 REPS=2 EXTRA="--cpu-threads 16" bash "$C/bench-spec-window.sh" "$F" | grep -E "^\| 4"
              done ;;
    window-grid) # the window with each kernel-cache variant of WIN_KC (names in /tmp/kc), REPS=2 each
              # (a name may come back: alternating rounds, each run's log its own, window-N-NAME)
              i=0; for v in ${WIN_KC:-default}; do
                i=$((i + 1)); defs=$(cat "/tmp/kc/$v/DEFINES" 2>/dev/null)
                run "window-$i-$v" 90 env STRATA_CACHE_DIR="/tmp/kc/$v" STRATA_NVRTC_DEFINES="$defs" \
                  STRATA="$S" BACKEND=cuda EXPERT_CACHE=3072 KS=4 \
                  REPS=2 EXTRA="--profile $P --cpu-threads 16" bash "$C/bench-spec-window.sh" "$F" | grep -E "^\| 4"
              done ;;
    window-res) # the window with every expert on the device (no cache), then the same with
              # WSKIP left out besides the defaults (RES_ROUNDS rounds, alternating)
              for r in $(seq "${RES_ROUNDS:-1}"); do
                run "window-res-$r" 90 env STRATA="$S" BACKEND=cuda KS=4 REPS=2 EXTRA="--cpu-threads 16" \
                  bash "$C/bench-spec-window.sh" "$F" | grep -E "^\| 4"
                [ -n "${WSKIP:-}" ] && run "window-res-skip-$r" 90 env STRATA_CUDA_SKIP="$DEF,$WSKIP" STRATA="$S" \
                  BACKEND=cuda KS=4 REPS=2 EXTRA="--cpu-threads 16" bash "$C/bench-spec-window.sh" "$F" | grep -E "^\| 4"
              done ;;
    kt-win-res) run kt-win-res 90 env STRATA_KERNEL_TIMING=1 "$S" bench -m "$F" --backend cuda \
                  -p 64 -n 128 -r 1 --spec-window-cost 4 ;;
    window-noq8) # the same without mul_mat_experts_cached_multi_q8 (cached_multi takes the windows)
              run window-noq8 120 env STRATA_CUDA_SKIP="$NOQ8" STRATA="$S" BACKEND=cuda EXPERT_CACHE=3072 KS=4 \
                REPS=3 EXTRA="--profile $P --cpu-threads 16" bash "$C/bench-spec-window.sh" "$F" ;;
    kt-att) run kt-att 90 env STRATA_KERNEL_TIMING=1 $B -p 0 -d 32768 -n 32
            run kt-att-long 90 env STRATA_KERNEL_TIMING=1 STRATA_CUDA_SKIP=$DEF,attention_flash,attention_flash_q8 \
              $B -p 0 -d 32768 -n 32 ;;
    kt-win) run kt-win 90 env STRATA_KERNEL_TIMING=1 $B -p 64 -n 128 -r 1 --spec-window-cost 4 ;;
    kcache) # kernel caches built here by precompile_kernels (tools/h200_build_carry.sh,
            # KCACHE_VARIANTS): /tmp/kc/NAME/kernels/sm_90, NAME/DEFINES; strata starts on the
            # default's images instead of compiling model.cu (over a minute)
            # every variant's images also in the default's folder (their names hash the defines),
            # so a test that opens a device with other defines (attention_short) finds them too
            mkdir -p /tmp/kc && tar xJf "$C/kcache.tar.xz" -C /tmp/kc && export STRATA_CACHE_DIR=/tmp/kc/default
            for v in /tmp/kc/*/kernels/sm_90; do cp -n "$v"/* /tmp/kc/default/kernels/sm_90/ 2>/dev/null; done
            stamp "kernel caches: $(ls /tmp/kc | tr '\n' ' ')" ;;
    sweep) # the long-span attention's tuning constants: each cached variant (STRATA_NVRTC_DEFINES
           # from NAME/DEFINES), every expert resident, per-kernel times at SWEEP_DEPTH; the
           # fastest attention launch's variant is kept for the later steps
           best="" best_us=1e9
           for v in ${SWEEP:-default p64 p32}; do
             defs=$(cat "/tmp/kc/$v/DEFINES" 2>/dev/null)
             run "sweep-$v" 150 env STRATA_KERNEL_TIMING=1 STRATA_CACHE_DIR="/tmp/kc/$v" STRATA_NVRTC_DEFINES="$defs" \
               "$S" bench -m "$F" --backend cuda -p 0 -d "${SWEEP_DEPTH:-32768}" -n 16 -r 1
             us=$(awk '$1 == "attention" {print $4}' "$L/sweep-$v.txt" | head -1)
             echo "  $v ($defs): attention ${us:-?} us a launch"
             [ -n "$us" ] && awk "BEGIN {exit !($us < $best_us)}" && { best=$v; best_us=$us; }
           done
           [ -n "$best" ] && export STRATA_CACHE_DIR="/tmp/kc/$best" STRATA_NVRTC_DEFINES="$(cat "/tmp/kc/$best/DEFINES")"
           stamp "sweep: kept ${best:-none} ($best_us us)" ;;
    tg-sweep) # decode with each kernel-cache variant (TG_SWEEP names in /tmp/kc), TG_ROUNDS
           # interleaved rounds (default 2): tg tokens/s of `bench -p 0 -n 64 -r 2` at the 50%
           # cache, and with every expert resident (TG_FULL=1)
           for round in $(seq "${TG_ROUNDS:-2}"); do for v in ${TG_SWEEP:-default}; do
             defs=$(cat "/tmp/kc/$v/DEFINES" 2>/dev/null)
             run "tg-$v-$round" 120 env STRATA_CACHE_DIR="/tmp/kc/$v" STRATA_NVRTC_DEFINES="$defs" $B -p 0 -n 64 -r 2
             [ "${TG_FULL:-0}" = 1 ] && run "tg-full-$v-$round" 120 env STRATA_CACHE_DIR="/tmp/kc/$v" \
               STRATA_NVRTC_DEFINES="$defs" "$S" bench -m "$F" --backend cuda -p 0 -n 64 -r 2
           done; done ;;
    smol-diag) # SmolLM2's window cost: graphs on / off, without mul_mat_vec_q8_rows
           [ -f "$SM" ] || { stamp "no SmolLM2 (smol first)"; continue; }
           SB="$S bench -m $SM --backend cuda -p 64 -n 128 -r 2 --spec-window-cost 1,2,3,4"
           run smol-win 60 $SB
           run smol-win-kt 60 env STRATA_KERNEL_TIMING=1 "$S" bench -m "$SM" --backend cuda -p 64 -n 128 -r 1 --spec-window-cost 4
           run smol-win-nographs 90 $SB --no-graphs
           run smol-win-norows 60 env STRATA_CUDA_SKIP="$NOROWS" $SB
           run smol-win-qkv3 60 env STRATA_CUDA_SKIP="$QKV3" $SB ;;
    quick) for t in ${QUICK:-attention_flash model_ops model_logits}; do [ -x "$C/$t" ] && run "quick-$t" 200 "$C/$t" --test-threads=1; done ;;
    cb) [ -x "$C/cuda_backend" ] && run test-cuda_backend "${CB_LIMIT:-300}" "$C/cuda_backend" --test-threads=1 ;;
    unpack) # the binaries travel xz-packed (tools/h200_build_carry.sh BUNDLE=1) to leave room in a call
            [ -f "$C/bundle.tar.xz" ] && tar xJf "$C/bundle.tar.xz" -C "$C" && rm "$C/bundle.tar.xz"
            stamp "carry: $(cat "$C/COMMIT" 2>/dev/null) $(ls "$C" | wc -l) files" ;;
    stash) # pieces of SmolLM2 (tools/h200_smol_parts.sh), one or more a call, kept in /dev/shm
           mkdir -p "$SD" && for f in .carry/smol*/part.*; do [ -f "$f" ] && cp "$f" "$SD/"; done
           stamp "SmolLM2 pieces: $(ls "$SD" | tr '\n' ' ')" ;;
    smol) # the pieces joined and checked, then SmolLM2 on the GPU: its logits test against the
          # CPU, and speculative decoding next to llama.cpp's n-gram and draft-model modes
          [ -f "$SM" ] || { cat "$SD"/part.* | xz -d > "$SM" && rm -f "$SD"/part.*; }
          sum=$(sha256sum "$SM" | cut -d' ' -f1)
          [ "$sum" = "$(cat .carry/smol*/SHA256 2>/dev/null | head -1)" ] || { stamp "SmolLM2 checksum $sum differs"; rm -f "$SM"; continue; }
          export STRATA_SMOLLM2=$SM
          run smol-logits 200 "$C/model_logits" --test-threads=1 smollm2 ;;
    smol-spec) [ -f "$SM" ] || { stamp "no SmolLM2 (smol first)"; continue; }
          wait_llama && run smol-spec "$(left)" env STRATA="$S" MODEL="$SM" STRATA_ARGS="--backend cuda" \
            LLAMA_BIN="$LB" LLAMA_ARGS="-ngl 99" LLAMA_DRAFT="$SM" LLAMA_DRAFT_ARGS="-ngld 99" \
            REPS="${SMOL_REPS:-2}" bash ci/bench-spec.sh ;;
    ncu) # Nsight Compute on a few launches of the products a decode step and a window spend most in
         # (50% cache: eager launches), and llama.cpp's matvec on the same file all resident
         sec="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats"
         # shellcheck disable=SC2086
         run ncu-step 120 ncu --kernel-name "regex:${NCU_KERNELS:-mul_mat_experts_cached|experts_gate_up|mul_mat_vec|mul_mat_qkv}" \
           --launch-skip 400 --launch-count 8 $sec $B -p 0 -n 12 -r 1
         # shellcheck disable=SC2086
         run ncu-window 120 env STRATA_CUDA_SKIP="$DEF" ncu --kernel-name "regex:mul_mat_experts_cached_multi|mul_mat_vec_q8_rows" \
           --launch-skip 200 --launch-count 6 $sec $B -p 64 -n 24 -r 1 --spec-window-cost 4
         ;;
    ncu-layer) # every kernel of decode steps at depth ~NCU_DEPTH (every expert resident): each
         # launch's duration and DRAM throughput, serialised (no PDL overlap), to compare with
         # the replayed graph's per-kernel events; NCU_ARGS replaces the sections and settings
         d=${NCU_DEPTH:-256}
         # shellcheck disable=SC2086
         run ncu-layer 200 ncu --launch-skip "${NCU_SKIP:-3000}" --launch-count "${NCU_COUNT:-60}" \
           ${NCU_ARGS:---section SpeedOfLight} "$S" bench -m "$F" --backend cuda --cpu-threads 16 -p "$d" -n 8 -r 1
         python3 tools/ncu_layer_summary.py "$L/ncu-layer.txt" > "$L/ncu-layer-short.txt"
         head -80 "$L/ncu-layer-short.txt" ;;
    ncu-win) # every launch of a verify window's own kernels (50% cache, K=4) under Nsight
         # Compute, after the prompt's and the first windows' (NCU_WIN_SKIP); the kernels a
         # window shares with a step are ncu-layer's
         # shellcheck disable=SC2086
         run ncu-win 200 ncu --kernel-name "regex:${NCU_WIN_KERNELS:-_rows|_window|_multi|qk_norm_rope|q8_qkv$}" \
           --launch-skip "${NCU_WIN_SKIP:-400}" --launch-count "${NCU_COUNT:-60}" ${NCU_ARGS:---section SpeedOfLight} \
           $B -p 64 -n 40 -r 1 --spec-window-cost 4
         python3 tools/ncu_layer_summary.py "$L/ncu-win.txt" > "$L/ncu-win-short.txt"
         head -70 "$L/ncu-win-short.txt" ;;
    ncu-llama) # shellcheck disable=SC2086
         sec="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats"
         wait_llama && run ncu-llama 120 ncu --kernel-name "regex:mul_mat_vec_q" --launch-skip 300 --launch-count 8 $sec \
           "$LB/llama-bench" -m "$F" -ngl 99 -fa 1 -p 0 -n 4 -r 1
         for n in llama step window; do grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Grid Size|Block Size|Stall|One or More|No Eligible" \
           "$L/ncu-$n.txt" 2>/dev/null | head -60 > "$L/ncu-$n-short.txt"; done ;;
    pool) for th in 16 8; do run "pool-$th" 60 env STRATA_KERNEL_TIMING=1 STRATA_POOL_BENCH_FILE="$F" \
            STRATA_POOL_BENCH_THREADS=$th "$C/pool_timing"; done ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
[ -n "${LP:-}" ] && { wait "$LP"; stamp "llama build: $(tail -1 "$L/llama-build.txt")"; }
stamp done
