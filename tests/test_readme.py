"""Every code block of README.md (and the runnable examples of docs/traces.md) runs as
written, standalone, in a scratch folder.

Blocks marked `<!-- readme-test: setup -->` create the virtual environment; the tests one
must be `.ci/run`'s command verbatim. Blocks marked `<!-- readme-test: slow -->` (minutes)
run only with MOEJAX_README_SLOW=1. `.venv` in the scratch folder links to the environment
running the tests.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(?:<!-- (?:readme-test|docs-example): (\S+) -->\n)?```(\w+)\n(.*?)```",
                   re.S)


def blocks(path: Path) -> list[tuple[str, str, str, int]]:
    """(marker or "", language, code, 1-based line) of each fenced block."""
    text = path.read_text()
    return [(m.group(1) or "", m.group(2), m.group(3), text.count("\n", 0, m.start()) + 1)
            for m in BLOCK.finditer(text)]


README = blocks(ROOT / "README.md")
DOCS = [b for b in blocks(ROOT / "docs" / "traces.md") if b[0] in ("recorder", "counts-csv")]


def _scratch(tmp_path: Path) -> Path:
    venv = Path(sys.executable).parent.parent
    (tmp_path / ".venv").symlink_to(venv, target_is_directory=True)
    return tmp_path


def _run(lang: str, code: str, cwd: Path, timeout: int = 600):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "COLUMNS": "120"}
    if lang == "bash":
        cmd = ["bash", "-euo", "pipefail", "-c", code]
    else:
        (cwd / "example.py").write_text(code)
        cmd = [str(cwd / ".venv" / "bin" / "python"), "example.py"]
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"block failed (rc {r.returncode}):\n{code}\n{r.stderr[-3000:]}"
    return r


def test_readme_blocks_are_marked_or_runnable():
    langs = {lang for _, lang, _, _ in README}
    assert langs <= {"bash", "python"}, langs
    setup = [code for mark, _, code, _ in README if mark == "setup"]
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1].replace(" -q ", " ")
    assert ci in [c.strip() for c in setup], "README's test command differs from .ci/run"
    for mark, lang, code, line in README:
        if lang == "bash" and mark != "setup":
            for cmd in re.findall(r"^(?!\.venv/bin/)(?:\S*/)?(moejax|python3?|pip)\b", code,
                                  re.M):
                pytest.fail(f"README.md:{line}: call {cmd} by its .venv/bin/ path")


@pytest.mark.parametrize("idx", [i for i, b in enumerate(README) if b[0] != "setup"],
                         ids=lambda i: f"README.md:{README[i][3]}")
def test_readme_block_runs(idx, tmp_path):
    mark, lang, code, _ = README[idx]
    if mark == "slow" and os.environ.get("MOEJAX_README_SLOW") != "1":
        pytest.skip("a minutes-long block; MOEJAX_README_SLOW=1 runs it")
    _run(lang, code, _scratch(tmp_path))


def test_docs_recorder_examples_run(tmp_path):
    assert [b[0] for b in DOCS] == ["recorder", "counts-csv"]
    cwd = _scratch(tmp_path)
    out = [_run(lang, code, cwd).stdout for _, lang, code, _ in DOCS]
    assert "dropped 1 of 5 token records" in out[0]
    assert "2 iterations x 2 layers, E=8, top_k=2, counts-only" in out[1]
