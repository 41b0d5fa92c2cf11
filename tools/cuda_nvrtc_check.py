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
NVRTC_LIB = "/tmp/nvrtc/nvidia/cu13/lib/libnvrtc.so.13"  # the wheel unpacked as above


def compile_module(lib: str, source: Path, arch: str, defines: list[str],
                   ptxas_verbose: bool = False) -> tuple[bool, str, bytes]:
    """NVRTC on one module with every kernels-cuda/*.cuh as a header (--std=c++17), as the
    CUDA backend compiles it: (compiled, log, cubin)."""
    nv = ctypes.CDLL(lib)
    headers = sorted(KERNELS.glob("*.cuh"))
    arr = lambda xs: (ctypes.c_char_p * len(xs))(*xs)
    prog = ctypes.c_void_p()
    r = nv.nvrtcCreateProgram(ctypes.byref(prog), source.read_text().encode(),
                              source.name.encode(), len(headers),
                              arr([h.read_text().encode() for h in headers]),
                              arr([h.name.encode() for h in headers]))
    assert r == 0, r
    opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++17"]
    opts += [b"--ptxas-options=-v"] if ptxas_verbose else []
    opts += [f"-D{d}".encode() for d in defines]
    ok = nv.nvrtcCompileProgram(prog, len(opts), arr(opts)) == 0
    size = ctypes.c_size_t()
    nv.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nv.nvrtcGetProgramLog(prog, log)
    cubin = b""
    if ok:
        nv.nvrtcGetCUBINSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        nv.nvrtcGetCUBIN(prog, buf)
        cubin = buf.raw
    nv.nvrtcDestroyProgram(ctypes.byref(prog))
    return ok, log.value.decode(errors="replace"), cubin


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--lib", default=NVRTC_LIB)
    ap.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("modules", nargs="*")
    a = ap.parse_args()
    modules = a.modules or [p.stem for p in sorted(KERNELS.glob("*.cu"))]
    failed = 0
    for m in modules:
        ok, log, _ = compile_module(a.lib, KERNELS / f"{m}.cu", a.arch, a.defines, True)
        print(f"== {m}.cu ({a.arch}): {'ok' if ok else 'FAILED'}")
        print(log)
        failed += not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
