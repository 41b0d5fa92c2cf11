#!/usr/bin/env python3
"""Compiles one kernels-cuda module with NVRTC as the CUDA backend does and prints its SASS
(nvdisasm), so a kernel's instruction stream can be read without a GPU machine.

    python3 tools/cuda_sass.py MODULE [-D NAME=VALUE ...] [--function NAME] [--stats]

--function keeps one kernel's section; --stats prints, per kernel, the instruction count
and the global byte loads, spills and dp4a it holds (e.g. predicated paths that issue even
when not taken). To read one format's path of a kernel that switches on a `type`
argument, compile a copy of the module with that argument fixed (session 17 did this for
mul_mat_experts_cached with `type = T_Q4_K;` in its body).

No CUDA toolkit is needed: the nvidia-cuda-nvrtc and nvidia-cuda-nvdisasm wheels unpacked
anywhere (pip download --no-deps nvidia-cuda-nvrtc nvidia-cuda-nvdisasm; unzip -d DIR);
--lib and --nvdisasm point at them.
"""
import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cuda_nvrtc_check import KERNELS, NVRTC_LIB, compile_module  # noqa: E402


def sections(sass: str) -> dict[str, list[str]]:
    """Each kernel's instruction lines, by name."""
    out: dict[str, list[str]] = {}
    name = None
    for line in sass.splitlines():
        m = re.match(r"^\.text\.(\S+):", line)
        if m:
            name = m.group(1)
            out[name] = []
        elif name and re.search(r"/\*[0-9a-f]{4,}\*/", line):
            out[name].append(line)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("module", help="a kernels-cuda/*.cu stem, or a path to a .cu file")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--lib", default=NVRTC_LIB)
    ap.add_argument("--nvdisasm", default="/tmp/nvd/x/nvidia/cu13/bin/nvdisasm")
    ap.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--function")
    ap.add_argument("--stats", action="store_true")
    a = ap.parse_args()
    module = Path(a.module) if a.module.endswith(".cu") else KERNELS / f"{a.module}.cu"
    ok, log, cubin = compile_module(a.lib, module, a.arch, a.defines)
    if not ok:
        sys.exit(log)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([a.nvdisasm, "-c", f.name], check=True, capture_output=True,
                              text=True).stdout
    kernels = sections(sass)
    if a.function:
        kernels = {a.function: kernels.get(a.function, [])}
    for name, lines in kernels.items():
        if a.stats:
            n = {k: sum(1 for l in lines if re.search(pat, l))
                 for k, pat in [("u8", r"LDG\.E\.U8"), ("x16", r"LDG\.E\.128"),
                                ("dp4a", r"IDP\.4A"), ("stl", r"STL")]}
            print(f"{name}: {len(lines)} instructions, {n['u8']} byte loads, "
                  f"{n['x16']} 16-byte loads, {n['dp4a']} dp4a, {n['stl']} spill stores")
        else:
            print(f"== {name}")
            print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
