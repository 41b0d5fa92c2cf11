#!/usr/bin/env python3
"""Compiles a kernels-cuda module with NVRTC for sm_90 on a machine without a GPU and
prints ptxas's resource report (registers, spills, shared memory) per kernel: what the
GPU machine would run, checked before spending device time.

    LIBNVRTC=/path/libnvrtc.so.13 python3 tools/nvrtc_resources.py kernels-cuda/model.cu
(pip download nvidia-cuda-nvrtc provides the library.)"""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cuda_nvrtc_check import compile_module  # noqa: E402

ok, text, _ = compile_module(os.environ.get("LIBNVRTC", "libnvrtc.so.13"), Path(sys.argv[1]),
                             sys.argv[2] if len(sys.argv) > 2 else "sm_90", [], True)
fn = None
for line in text.splitlines():
    if "Compiling entry function" in line:
        fn = line.split("'")[1]
    elif "Used" in line and "registers" in line or "spill" in line:
        print(f"{fn}: {line.split(':', 1)[-1].strip()}")
if not ok:
    print(text)
    sys.exit(1)
