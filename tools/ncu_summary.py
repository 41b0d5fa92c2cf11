#!/usr/bin/env python3
"""Per-kernel summary of an `ncu --csv` run (one row per profiled launch): launches, total
and median time, DRAM bytes, achieved occupancy, per kernel name, largest total first.

    ncu --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,... PROGRAM > run.csv
    python3 tools/ncu_summary.py run.csv [--last N]   (N: only the last N launches)
"""
import csv
import statistics
import sys
from collections import defaultdict


def rows(path):
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    return list(csv.DictReader(lines))


def main():
    path = sys.argv[1]
    last = int(sys.argv[sys.argv.index("--last") + 1]) if "--last" in sys.argv else 0
    launches = defaultdict(dict)
    order = []
    for r in rows(path):
        key = r["ID"]
        if key not in launches:
            order.append(key)
        launches[key]["name"] = r["Kernel Name"].split("(")[0]
        try:
            launches[key][r["Metric Name"]] = float(r["Metric Value"].replace(",", ""))
        except ValueError:
            pass
    if last:
        order = order[-last:]
    per = defaultdict(list)
    for key in order:
        per[launches[key]["name"]].append(launches[key])
    total = sum(l.get("gpu__time_duration.sum", 0) for k in order for l in [launches[k]])
    print(f"{len(order)} launches, {total / 1e3:.1f} us of kernel time")
    print(f"{'kernel':40} {'n':>5} {'total us':>9} {'median us':>9} {'MB read':>8} {'GB/s':>6} {'occ%':>5} {'grid':>7} {'blk':>4} {'regs':>4}")
    table = []
    for name, ls in per.items():
        t = [l.get("gpu__time_duration.sum", 0) for l in ls]
        b = [l.get("dram__bytes_read.sum", 0) for l in ls]
        table.append((sum(t), name, ls, t, b))
    for tot, name, ls, t, b in sorted(table, reverse=True):
        med = statistics.median(t)
        mb = sum(b) / 1e6
        gbs = sum(b) / tot if tot else 0
        occ = statistics.median([l.get("sm__warps_active.avg.pct_of_peak_sustained_active", 0) for l in ls])
        grid = statistics.median([l.get("launch__grid_size", 0) for l in ls])
        blk = statistics.median([l.get("launch__block_size", 0) for l in ls])
        regs = statistics.median([l.get("launch__registers_per_thread", 0) for l in ls])
        print(f"{name[:40]:40} {len(ls):5d} {tot / 1e3:9.1f} {med / 1e3:9.2f} {mb:8.1f} {gbs:6.0f} {occ:5.1f} {grid:7.0f} {blk:4.0f} {regs:4.0f}")


if __name__ == "__main__":
    main()
