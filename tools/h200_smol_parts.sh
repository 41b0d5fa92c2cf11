#!/usr/bin/env bash
# SmolLM2-135M-Instruct Q4_1 (98 MB; 90 MB xz-packed) for the GPU machine, where a call's
# tree and carry may not pass 64 MiB: the packed file cut into pieces of the sizes given
# (MB), one folder each (.carry/smol1, .carry/smol2, ...), to carry in consecutive calls of
# one warm machine; tools/h200_call.sh's stash step keeps each in /dev/shm, its smol step
# joins them (checked against SHA256) and runs SmolLM2 on the GPU.
#   tools/h200_smol_parts.sh 20 36 36
set -euo pipefail
cd "$(dirname "$0")/.."
model=${MODEL:-$(ci/fetch-models.sh)}
rm -rf .carry/smol*
packed=$(mktemp)
trap 'rm -f "$packed"' EXIT
xz -T2 -9 -c "$model" > "$packed"
total=$(stat -c %s "$packed") at=0 i=0
for mb in "$@"; do
  [ "$at" -ge "$total" ] && break
  i=$((i + 1)) && mkdir -p ".carry/smol$i"
  dd if="$packed" of=".carry/smol$i/part.$i" bs=1000000 skip=$((at / 1000000)) count="$mb" status=none
  at=$((at + mb * 1000000))
  sha256sum "$model" | cut -d' ' -f1 > ".carry/smol$i/SHA256"
done
[ "$at" -ge "$total" ] || { echo "pieces of $* MB hold $at of $total bytes: give more" >&2; exit 1; }
du -sh .carry/smol*
