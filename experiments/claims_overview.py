"""The claims of every study at a glance: per study, how many claims are reproduced,
calibrated (a constant fitted to the number the claim tests) and failing, read from the
committed `docs/results/STUDY/summary.json`; prints the Markdown table of
`docs/reproduction/README.md` (`tests/test_claims_overview.py` checks the page against it).

    python experiments/claims_overview.py [RESULTS_DIR]
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from moejax.reproduce.study import Claim, tally

STUDIES = ("fsedp", "moentwine", "amoe", "epsmoe", "dysharp", "balancing", "tuning")


def claim_of(row: dict) -> Claim:
    """A summary.json claim row as a `Claim` (older summaries lack the newer fields; only
    `holds` is needed for a verdict)."""
    return Claim(**{"id": "", "paper": "", "simulated": None} | {
        f.name: row[f.name] for f in dataclasses.fields(Claim) if f.name in row})


def verdict(row: dict) -> str:
    """A summary row's verdict, by `Claim.verdict`'s rule."""
    return claim_of(row).verdict


def rows(results: Path) -> list[dict]:
    """Per study: grid, counts by verdict (`tally`), and how many claims are reproduced only
    after a model change."""
    out = []
    for name in STUDIES:
        summary = json.loads((results / name / "summary.json").read_text())
        claims = [claim_of(c) for c in summary["claims"]]
        out.append({"study": name, "grid": "quick" if summary["quick"] else "full",
                    **tally(claims),
                    "changed": sum(bool(c.changed_after_failure) and c.verdict == "reproduced"
                                   for c in claims)})
    return out


def table(results: Path) -> str:
    lines = ["| study | grid | reproduced | calibrated | fail | total | reproduced after a "
             "model change |", "|---|---|---|---|---|---|---|"]
    tot = dict.fromkeys(("reproduced", "calibrated", "fails", "total", "changed"), 0)
    for r in rows(results):
        lines.append(f"| {r['study']} | {r['grid']} | {r['reproduced']} | {r['calibrated']} | "
                     f"{r['fails']} | {r['total']} | {r['changed']} |")
        for k in tot:
            tot[k] += r[k]
    lines.append(f"| **all** | | **{tot['reproduced']}** | {tot['calibrated']} | "
                 f"{tot['fails']} | {tot['total']} | {tot['changed']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(Path(sys.argv[1]) if len(sys.argv) > 1 else
                Path(__file__).resolve().parents[1] / "docs" / "results"))
