"""Print the Markdown tables of docs/reproduction/balancing.md from the balancing study's
outputs (default: the shipped `docs/results/balancing/`), so the doc's numbers are
regenerated from the results, never typed.

    .venv/bin/python experiments/balancing_tables.py [--results DIR]
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from moejax.reproduce import shipped_results
from moejax.reproduce.balancing import LABELS, PLACEMENTS
from moejax.reproduce.balancing_data import WORKLOADS


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def num(x: str) -> float:
    return float(x) if x not in ("", "nan") else float("nan")


def fmt(x: float, digits: int = 3) -> str:
    return "-" if x != x else f"{x:.{digits}f}"


def table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def points(rows: list[dict]):
    """(workload, platform, {placement: row}) per point, in the CSV's order."""
    for r0 in rows:
        if r0["placement"] == "contiguous":
            w, p = r0["workload"], r0["platform"]
            yield w, p, {r["placement"]: r for r in rows
                         if r["workload"] == w and r["platform"] == p}


def placements_table(rows: list[dict]) -> str:
    names = [*PLACEMENTS, "oracle"]
    header = ["recording", "platform", *[LABELS[n] for n in names],
              "tuned+replicas / EPLB-1", "same, on the training batches", "tuned / EPLB-0"]
    body = []
    for w, p, by in points(rows):
        lat = {n: num(by[n]["latency_ms_mean"]) for n in names}
        body.append([WORKLOADS[w].label, p, *[fmt(lat[n]) for n in names],
                     fmt(lat["tuned+replicas"] / lat["eplb-1"], 4),
                     fmt(num(by["tuned+replicas"].get("train_latency_ms_mean", "nan"))
                         / num(by["eplb-1"].get("train_latency_ms_mean", "nan")), 4),
                     fmt(lat["tuned"] / lat["eplb-0"], 4)])
    return table(header, body)


def load_table(rows: list[dict]) -> str:
    names = ("contiguous", "greedy", "eplb-0", "eplb-1", "eplb-4", "tuned+replicas", "oracle")
    header = ["recording", "platform", *[LABELS[n] for n in names]]
    body = []
    for w, p, by in points(rows):
        body.append([WORKLOADS[w].label, p,
                     *[f"{fmt(num(by[n]['load_ratio_mean']), 2)} / "
                       f"{fmt(num(by[n]['load_ratio_p99']), 2)}" for n in names]])
    return table(header, body)


def redundancy_table(rows: list[dict]) -> str:
    header = ["recording", "platform", "weights / device at 0, 1, 2, 4 slots (GB)",
              "prefill latency at 0, 1, 2, 4 slots (ms)", "decode latency (ms)"]
    body = []
    for r0 in rows:
        if r0["placement"] != "eplb-0":
            continue
        w, p = r0["workload"], r0["platform"]
        by = [r for r in rows if r["workload"] == w and r["platform"] == p
              and r["placement"] in ("eplb-0", "eplb-1", "eplb-2", "eplb-4")]
        cell = [("" if r["fits_memory"] == "True" else "(does not fit) ") for r in by]
        body.append([WORKLOADS[w].label, p,
                     ", ".join(fmt(num(r["weight_gb_per_device"]), 1) for r in by),
                     ", ".join(c + fmt(num(r["latency_ms_mean"])) for c, r in zip(cell, by,
                                                                                   strict=True)),
                     ", ".join(fmt(num(r["decode_latency_ms_mean"]), 4) for r in by)])
    return table(header, body)


def rebalancing_table(rows: list[dict]) -> str:
    header = ["drifting workload", "platform", "migration", "never planned (ms)",
              "planned once (best W)", "every iteration (best W)", "best (R, W)",
              "best (ms)", "re-plans at best", "moved per re-plan (GB)"]
    body = []
    keys = []
    for r in rows:
        k = (r["workload"], r["platform"], r["migration"])
        if k not in keys:
            keys.append(k)
    for w, p, m in keys:
        sel = [r for r in rows if (r["workload"], r["platform"], r["migration"]) == (w, p, m)]
        longest = max(int(r["window"]) for r in sel)
        never = next(r for r in sel if int(r["window"]) == longest)
        sel = [r for r in sel if int(r["window"]) < longest]
        once = min((r for r in sel if int(r["interval"]) == 0),
                   key=lambda r: num(r["forward_ms"]))
        every = min((r for r in sel if int(r["interval"]) == 1),
                    key=lambda r: num(r["forward_ms"]))
        best = min((r for r in sel if int(r["interval"]) >= 1),
                   key=lambda r: num(r["forward_ms"]))
        plans = num(best["replans"])
        body.append([WORKLOADS[w].label, p, m, fmt(num(never["forward_ms"]), 2),
                     f"{fmt(num(once['forward_ms']), 2)} (W = {once['window']})",
                     f"{fmt(num(every['forward_ms']), 2)} (W = {every['window']})",
                     f"({best['interval']}, {best['window']})",
                     fmt(num(best["forward_ms"]), 2), fmt(plans, 0),
                     fmt(num(best["migration_gb"]) / max(plans, 1.0), 1)])
    return table(header, body)


def claims_table(summary: dict) -> str:
    body = [[f"`{c['id']}`", "yes" if c["holds"] else "**no**", c["paper"]]
            for c in summary["claims"]]
    return table(["claim", "holds", "statement"], body)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=None, help="study outputs (default: shipped)")
    args = ap.parse_args(argv)
    res = Path(args.results) if args.results else shipped_results("balancing")
    summary = json.loads((res / "summary.json").read_text())
    placements = read_csv(res / "placements.csv")
    rebalancing = read_csv(res / "rebalancing.csv")
    smoothed = json.loads((res / "smoothed.json").read_text())
    mode = "quick" if summary["quick"] else "full"
    print(f"Mode: {mode}; {summary['wall_s']:.0f} s.\n")
    print("### Claims\n\n" + claims_table(summary) + "\n")
    print("### Held-out MoE layer latency per placement (ms, mean over held-out batches)\n\n"
          + placements_table(placements) + "\n")
    print("### Held-out max / mean device load (mean / p99 over batches)\n\n"
          + load_table(placements) + "\n")
    print("### Redundant slots: memory and EPLB's latency\n\n" + redundancy_table(placements)
          + "\n")
    print("### Rebalancing over time (iteration time incl. migration stalls, ms)\n\n"
          + rebalancing_table(rebalancing) + "\n")
    if smoothed:
        f = smoothed["final"]
        print(f"Smoothed-gradient (R, W) on {WORKLOADS[smoothed['workload']].label}, "
              f"{smoothed['platform']}: R = {f['interval']}, W = {f['window']}, "
              f"{smoothed['final_ms']:.2f} ms per iteration after "
              f"{len(smoothed['history'])} steps.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
