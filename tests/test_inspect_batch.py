"""`moejax trace inspect` on a batch and `simulate --trace` on a recording:
one skew definition, no nan rows or RuntimeWarnings, --json always written, the recording's
own trace / iteration counts reported, and --tokens refused rather than ignored."""

from __future__ import annotations

import json
import warnings

import jax
import numpy as np
import pytest

from moejax.cli import main as cli
from moejax.trace import gen, io, summary


@pytest.fixture(scope="module")
def batch_file(tmp_path_factory):
    """4 powerlaw traces x 2 iterations x 2 layers x 3 tokens, E=8, k=2 (fewer tokens than
    most batch sizes of the activated-expert table)."""
    path = tmp_path_factory.mktemp("b") / "b.npz"
    tr = gen.generate("powerlaw:alpha=1.2", jax.random.key(0), num_traces=4, iterations=2,
                      layers=2, tokens=3, num_experts=8, top_k=2)
    io.save(path, tr, {"generator": "powerlaw:alpha=1.2"})
    return path, tr


def test_inspect_batch_one_skew_no_nan_json_written(batch_file, tmp_path, capsys):
    path, tr = batch_file
    out = tmp_path / "b.json"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning fails the test
        assert cli.main(["trace", "inspect", str(path), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "nan" not in text.lower()
    assert "4 traces" in text and "mean over the 4 traces" in text
    doc = json.loads(out.read_text())
    s = doc["summary"]
    # the table's per-layer skew is each trace's own (pooled over its iterations), averaged
    c = np.asarray(tr.counts, np.float64).sum(1)  # [T, L, E]
    p = c / c.sum(-1, keepdims=True)
    want = (p.max(-1) / p.mean(-1)).mean(0)
    np.testing.assert_allclose(s["skew_per_trace_per_layer"], want, rtol=1e-6)
    rows = [ln.split() for ln in text.splitlines() if ln.split()[:1] in (["0"], ["1"])]
    np.testing.assert_allclose([float(r[1]) for r in rows[:2]], want, atol=5e-4)
    # pooled over traces would be lower: the traces' hot experts differ
    assert s["skew"] < want.mean()
    assert doc["analysis_of_trace"] == 0 and "activated" in doc


def test_format_analysis_skips_unmeasurable_batch_sizes():
    tr = gen.generate("uniform", jax.random.key(1), num_traces=1, iterations=1, layers=2,
                      tokens=2, num_experts=64, top_k=2)[0]
    from moejax.trace import analysis

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        text = analysis.format_analysis(analysis.analyze(tr))
        summary.format_summary(summary.summarize(tr))
    assert "nan" not in text
    assert "fewer than m recorded tokens" in text


def test_simulate_recording_counts_and_refuses_tokens(batch_file, tmp_path, capsys):
    path, _ = batch_file
    out = tmp_path / "sim"
    rc = cli.main(["simulate", "--trace", str(path), "--model", "mixtral-8x7b", "--tokens",
                   "64", "--quiet", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "--tokens" in err
    assert not out.exists()
    rc = cli.main(["simulate", "--trace", str(path), "--model", "mixtral-8x7b", "--quiet",
                   "--out", str(out)])
    assert rc == 0
    assert "4 traces x 2 iterations" in capsys.readouterr().out
    s = json.loads((out / "summary.json").read_text())
    assert (s["traces"], s["iterations"], s["tokens"]) == (4, 2, 3.0)
