"""The whole path of docs/traces.md (recording -> import -> inspect -> concat / split ->
plan and tune on one part -> score on the other -> latency table) runs as written on the
recordings shipped in tests/data/olmoe, and every output names its data. The ESFT
cross-task study of docs/reproduction/balancing.md runs with MOEJAX_README_SLOW=1 where
the shared recordings are checked out beside the repository (`../shared/traces`)."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BLOCK = re.compile(r"(?:<!-- docs-example: (\S+) -->\n)?```(\w+)\n(.*?)```", re.S)
ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"


def _scratch(tmp_path: Path) -> Path:
    """A folder that looks like a checkout: .venv, tests/data, ../shared when present."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / ".venv").symlink_to(Path(sys.executable).parent.parent, target_is_directory=True)
    (repo / "tests").mkdir()
    (repo / "tests" / "data").symlink_to(ROOT / "tests" / "data", target_is_directory=True)
    if SHARED.is_dir():
        (tmp_path / "shared").mkdir()
        (tmp_path / "shared" / "traces").symlink_to(SHARED, target_is_directory=True)
    return repo


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run a bash block in `cwd`; its moejax processes share one persistent compilation cache
    of their own (fresh per test, beside `cwd`), as a user's commands share theirs: a program
    that a later command needs again is read back, not compiled again."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "COLUMNS": "120",
           "MOEJAX_COMPILATION_CACHE": str(cwd.parent / "jax_cache")}
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, f"block failed (rc {r.returncode}):\n{code}\n{r.stderr[-3000:]}"
    return r


def _block(path: Path, mark: str) -> str:
    found = [m.group(3) for m in BLOCK.finditer(path.read_text())
             if m.group(1) == mark and m.group(2) == "bash"]
    assert len(found) == 1, f"{path.name}: one block marked {mark!r}"
    return found[0]


def test_docs_whole_path_runs_and_names_its_data(tmp_path):
    cwd = _scratch(tmp_path)
    r = _run(_block(ROOT / "docs" / "traces.md", "path"), cwd)
    assert "held out (iterations 2:3)" in r.stdout
    eplb = json.loads((cwd / "sim-eplb" / "summary.json").read_text())
    assert eplb["held_out"]["iterations"] == "2:3"
    data = eplb["provenance"]["data"]
    assert [p["source"] for p in data["parts"]] == [
        ["tests/data/olmoe/mistral_expert_counts_c4.pkl"],
        ["tests/data/olmoe/mistral_expert_counts_arxiv.pkl"],
        ["tests/data/olmoe/mistral_expert_counts_arxiv.pkl"]]
    scored = json.loads((cwd / "sim-tuned" / "summary.json").read_text())
    assert scored["provenance"]["data"]["derived"][-1] == (
        "split train fraction 0.34: held out = iterations 1:3")
    tuned = json.loads((cwd / "tuned" / "summary.json").read_text())
    assert tuned["run"]["trace"] == "cross.npz" and tuned["run"]["trace_gen"] is None
    assert "recording cross.npz" in (cwd / "tuned.toml").read_text()
    for name in ("table-ep.csv", "table-tuned.csv"):
        rows = list(csv.DictReader((cwd / name).open()))
        assert [int(r["num_tokens"]) for r in rows] == [256, 1024, 4096]
        assert rows[0]["routing"] == "recording score.npz"
        prov = json.loads((cwd / f"{name}.provenance.json").read_text())
        assert prov["data"]["kind"] == "concat"


@pytest.mark.skipif(not SHARED.is_dir(), reason="the shared ESFT recordings are not here")
def test_balancing_cross_task_study_runs(tmp_path):
    if os.environ.get("MOEJAX_README_SLOW") != "1":
        pytest.skip("about ten minutes on 2 cores; MOEJAX_README_SLOW=1 runs it")
    cwd = _scratch(tmp_path)
    _run(_block(ROOT / "docs" / "reproduction" / "balancing.md", "cross-task"), cwd)
    for name in ("eplb-law", "eplb-intent-then-law", "ep-law"):
        s = json.loads((cwd / f"sim-{name}" / "summary.json").read_text())
        assert s["provenance"]["data"]["kind"] in ("recording", "concat")
