"""Print the Markdown tables at the top of docs/tuning.md from the tuning study's outputs
(default: the shipped `docs/results/tuning/`; `--results docs/results/tuning/full` for the
full grid), so the doc's numbers are regenerated from the results, never typed: the
headline (final excess over the best / layer-traces to within 1 %), the comparison at
equal search wall time, and each method's search wall time of the whole budget.

    .venv/bin/python experiments/tuning_tables.py [--results DIR]
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from moejax.reproduce import shipped_results

METHODS = ("grad", "grad-greedy", "tpe", "cmaes", "random", "grid")
FIXED = ("best-heuristic", "default", "random-median")


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def num(x: str) -> float:
    return float(x) if x not in ("", "nan") else float("nan")


def _methods(rows: list[dict]) -> list[str]:
    have = {r["method"] for r in rows}
    return [m for m in METHODS if m in have]


def _table(head: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in body])


def headline(rows: list[dict]) -> str:
    methods = _methods(rows)
    body = []
    for fam in dict.fromkeys(r["family"] for r in rows):
        by = {r["method"]: r for r in rows if r["family"] == fam}
        spread = num(next(iter(by.values()))["random_spread_pct"])
        cells = [f"{fam} ({spread:.1f} %)"]
        for m in (*methods, *FIXED):
            r = by.get(m)
            if r is None:
                cells.append("refused" if m == "cmaes" and fam == "aep_decay" else "")
                continue
            cell = f"+{num(r['over_best_pct']):.2f} %"
            if m not in FIXED:
                t = num(r["layer_traces_to_1pct"])
                cell += (" / never" if t != t else f" / {t:,.0f}") + \
                    f" ({r['within_1pct_seeds']})"
            cells.append(cell)
        body.append(cells)
    return _table(["family (random spread)", *methods, *FIXED], body)


def equal_wall(rows: list[dict]) -> str:
    methods = _methods(rows)
    body = []
    for fam in dict.fromkeys(r["family"] for r in rows):
        by = {r["method"]: r for r in rows if r["family"] == fam}
        cells = [fam, f"{num(next(iter(by.values()))['equal_wall_s']):.2f}"]
        for m in methods:
            r = by.get(m)
            if r is None:
                cells.append("")
            elif r["over_best_pct"] == "":
                cells.append("no point by W")
            else:
                cells.append(f"+{num(r['over_best_pct']):.2f} % ({r['seeds_with_a_point']})")
        body.append(cells)
    return _table(["family", "W (s)", *methods], body)


def wall_spent(rows: list[dict]) -> str:
    methods = _methods(rows)
    body = []
    for fam in dict.fromkeys(r["family"] for r in rows):
        by = {r["method"]: r for r in rows if r["family"] == fam}
        body.append([fam, *(f"{num(by[m]['wall_s_spent']):.2f}" if m in by else ""
                           for m in methods)])
    return _table(["family", *methods], body)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=None,
                    help="a `moejax reproduce tuning` output folder (default: the shipped one)")
    args = ap.parse_args()
    src = args.results or shipped_results("tuning")
    head = read_csv(src / "headline.csv")
    print(headline(head), end="\n\n")
    print(equal_wall(read_csv(src / "headline_equal_wall.csv")), end="\n\n")
    print(wall_spent(head))


if __name__ == "__main__":
    main()
