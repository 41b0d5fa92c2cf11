#!/usr/bin/env python3
"""Compiles every kernels-cuda/*.cu module with NVRTC the way the CUDA backend does (its
*.cuh files as headers, --std=c++17) and prints the log with ptxas's register and spill
report, so compile errors show up before a GPU machine is used.

    python3 tools/cuda_nvrtc_check.py [--arch sm_90] [--lib /path/to/libnvrtc.so.13] [-D NAME=VALUE ...] [module ...]

-D passes a define to NVRTC, as the backend's STRATA_NVRTC_DEFINES does (e.g. -D ATT_FLASH_STAGED=1).

No CUDA toolkit is needed: the nvidia-cuda-nvrtc wheel unpacked anywhere gives the library
(e.g. unzip nvidia_cuda_nvrtc-13.*.whl -d /tmp/nvrtc; --lib /tmp/nvrtc/nvidia/cu13/lib/libnvrtc.so.13).
"""
import argparse
import ctypes
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "kernels-cuda"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--lib", default="/tmp/nvrtc/nvidia/cu13/lib/libnvrtc.so.13")
    ap.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("modules", nargs="*")
    a = ap.parse_args()
    nv = ctypes.CDLL(a.lib)
    headers = sorted(KERNELS.glob("*.cuh"))
    names = [h.name.encode() for h in headers]
    texts = [h.read_text().encode() for h in headers]
    modules = a.modules or [p.stem for p in sorted(KERNELS.glob("*.cu"))]
    failed = 0
    for m in modules:
        src = (KERNELS / f"{m}.cu").read_text().encode()
        prog = ctypes.c_void_p()
        arr = lambda xs: (ctypes.c_char_p * len(xs))(*xs)
        r = nv.nvrtcCreateProgram(ctypes.byref(prog), src, f"{m}.cu".encode(), len(headers),
                                  arr(texts), arr(names))
        assert r == 0, r
        opts = [f"--gpu-architecture={a.arch}".encode(), b"--std=c++17", b"--ptxas-options=-v"]
        opts += [f"-D{d}".encode() for d in a.defines]
        r = nv.nvrtcCompileProgram(prog, len(opts), arr(opts))
        size = ctypes.c_size_t()
        nv.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        nv.nvrtcGetProgramLog(prog, log)
        print(f"== {m}.cu ({a.arch}): {'ok' if r == 0 else 'FAILED'}")
        print(log.value.decode(errors="replace"))
        failed += r != 0
        nv.nvrtcDestroyProgram(ctypes.byref(prog))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
