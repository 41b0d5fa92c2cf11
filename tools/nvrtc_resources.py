#!/usr/bin/env python3
"""Compiles a kernels-cuda module with NVRTC for sm_90 on a machine without a GPU and
prints ptxas's resource report (registers, spills, shared memory) per kernel: what the
GPU machine would run, checked before spending device time.

    LIBNVRTC=/path/libnvrtc.so.13 python3 tools/nvrtc_resources.py kernels-cuda/model.cu
(pip download nvidia-cuda-nvrtc provides the library.)"""
import ctypes, os, sys
from pathlib import Path

lib = ctypes.CDLL(os.environ.get("LIBNVRTC", "libnvrtc.so.13"))
src_path = Path(sys.argv[1])
arch = sys.argv[2] if len(sys.argv) > 2 else "sm_90"
inc = src_path.parent
headers = sorted(p for p in inc.iterdir() if p.suffix in (".cuh", ".h"))
prog = ctypes.c_void_p()
names = (ctypes.c_char_p * len(headers))(*[p.name.encode() for p in headers])
bodies = (ctypes.c_char_p * len(headers))(*[p.read_bytes() for p in headers])
r = lib.nvrtcCreateProgram(ctypes.byref(prog), src_path.read_bytes(), src_path.name.encode(),
                           len(headers), bodies, names)
assert r == 0, r
opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++17", b"--ptxas-options=-v"]
opts_arr = (ctypes.c_char_p * len(opts))(*opts)
r = lib.nvrtcCompileProgram(prog, len(opts), opts_arr)
size = ctypes.c_size_t()
lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
log = ctypes.create_string_buffer(size.value)
lib.nvrtcGetProgramLog(prog, log)
text = log.value.decode(errors="replace")
fn = None
for line in text.splitlines():
    if "Compiling entry function" in line:
        fn = line.split("'")[1]
    elif "Used" in line and "registers" in line or "spill" in line:
        print(f"{fn}: {line.split(':', 1)[-1].strip()}")
if r != 0:
    print(text)
    sys.exit(1)
