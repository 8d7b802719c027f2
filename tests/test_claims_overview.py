"""docs/reproduction/README.md's tally of every study's claims is the one the committed
summary.json files give (experiments/claims_overview.py prints it), so the page cannot drift
from the results."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _overview():
    spec = importlib.util.spec_from_file_location(
        "claims_overview", ROOT / "experiments" / "claims_overview.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_page_table_matches_committed_results():
    page = (ROOT / "docs" / "reproduction" / "README.md").read_text()
    assert _overview().table(ROOT / "docs" / "results") in page


def test_verdict_of_a_summary_row():
    v = _overview().verdict
    assert v({"holds": True}) == "reproduced"
    assert v({"holds": True, "calibrated": "skew fitted to it"}) == "calibrated"
    assert v({"holds": False, "verdict": "fails"}) == "fails"
