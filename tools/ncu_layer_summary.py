#!/usr/bin/env python3
"""One line per launch of an `ncu` text report (tools/h200_call.sh ncu-layer): kernel, grid
x block, duration, elapsed cycles and the SMs' average active cycles (a one-block kernel's
SM was busy for avg x SMs cycles; far fewer than elapsed means launch and drain, or a tail).

    python3 tools/ncu_layer_summary.py ncu-layer.txt
"""
import re
import sys

KEYS = ("Duration", "Elapsed Cycles", "SM Active Cycles", "DRAM Throughput")


def main():
    rows, cur = [], None
    for line in open(sys.argv[1], errors="replace"):
        m = re.match(r"^  (\w+)[ (<].*\((\d+), 1, 1\)x\((\d+), 1, 1\)", line)
        if m and "Context" in line:
            cur = {"name": m.group(1), "grid": m.group(2), "block": m.group(3)}
            rows.append(cur)
            continue
        m = re.match(r"^\s+(%s)\s+\S+\s+(\S+)$" % "|".join(KEYS), line)
        if m and cur is not None:
            cur[m.group(1)] = m.group(2)
    for r in rows:
        print("%-28s grid %5s x %4s  us %7s  elapsed %8s  sm-active(avg) %9s  dram%% %6s" % (
            r["name"], r["grid"], r["block"], r.get("Duration"), r.get("Elapsed Cycles"),
            r.get("SM Active Cycles"), r.get("DRAM Throughput")))


if __name__ == "__main__":
    main()
