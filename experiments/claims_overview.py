"""The claims of every study at a glance: per study, how many claims are reproduced,
calibrated (a constant fitted to the number the claim tests) and failing, read from the
committed `docs/results/STUDY/summary.json`; prints the Markdown table of
`docs/reproduction/README.md` (`tests/test_claims_overview.py` checks the page against it).

    python experiments/claims_overview.py [RESULTS_DIR]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

STUDIES = ("fsedp", "moentwine", "amoe", "epsmoe", "dysharp", "balancing", "tuning")


def verdict(claim: dict) -> str:
    """A summary row's verdict (older summaries carry only `holds`)."""
    if "verdict" in claim:
        return claim["verdict"]
    if claim.get("calibrated"):
        return "calibrated"
    return "reproduced" if claim["holds"] else "fails"


def rows(results: Path) -> list[dict]:
    """Per study: grid, counts by verdict, and the ids of the claims not reproduced."""
    out = []
    for name in STUDIES:
        summary = json.loads((results / name / "summary.json").read_text())
        v = {c["id"]: verdict(c) for c in summary["claims"]}
        out.append({"study": name, "grid": "quick" if summary["quick"] else "full",
                    "total": len(v),
                    **{k: sum(x == k for x in v.values())
                       for k in ("reproduced", "calibrated", "fails")},
                    "changed": sum(bool(c.get("changed_after_failure"))
                                   and verdict(c) == "reproduced" for c in summary["claims"]),
                    "not_reproduced": [i for i, x in v.items() if x != "reproduced"]})
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
