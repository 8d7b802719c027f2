"""`moejax trace compare A B`: a recording or a fit against a recording,
per-layer skew and activated-expert curve with the docs' thresholds, and the warning when a
fit ends on the edge of its search grid."""

from __future__ import annotations

import json

import numpy as np
import pytest

from moejax.cli import main as cli
from moejax.trace import compare, core, fit, io


def _recording(rng, probs, iterations=4, layers=2, tokens=64, k=2):
    """A token-level recording drawn in NumPy (no generator compile): each token picks k
    distinct experts with probabilities `probs`."""
    e = len(probs)
    g = rng.gumbel(size=(iterations, layers, tokens, e)) + np.log(probs)
    ids = np.argsort(-g, axis=-1)[..., :k]  # Gumbel top-k: k draws without replacement
    w = np.full(ids.shape, 1.0 / k)
    return core.from_ids(ids, w, np.ones((iterations, tokens), bool), e)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cmp")
    rng = np.random.default_rng(0)
    flat = np.full(8, 1 / 8)
    hot = np.arange(1, 9, dtype=float) ** -2.5
    out = {name: io.save(d / f"{name}.npz", _recording(rng, p / p.sum()))
           for name, p in (("flat", flat), ("flat2", flat), ("hot", hot))}
    return d, out


def test_recording_against_itself_passes(files, capsys):
    _, f = files
    assert cli.main(["trace", "compare", str(f["hot"]), str(f["hot"])]) == 0
    text = capsys.readouterr().out
    assert "PASS" in text and "2/2 layers" in text


def test_different_skew_fails_with_numbers(files, tmp_path, capsys):
    _, f = files
    out = tmp_path / "c.json"
    assert cli.main(["trace", "compare", str(f["flat"]), str(f["hot"]), "--json", str(out)]) == 0
    assert "FAIL" in capsys.readouterr().out
    r = json.loads(out.read_text())
    # skew A / skew B - 1 per layer, from the two recordings' own pooled loads
    c = {k: np.asarray(io.load(f[k])[0].counts, np.float64).sum(0) for k in ("flat", "hot")}
    skew = {k: (v / v.sum(-1, keepdims=True)).max(-1) * 8 for k, v in c.items()}
    np.testing.assert_allclose(r["skew_rel_err"], skew["flat"] / skew["hot"] - 1, rtol=1e-6)
    assert not r["verdict"]["holds"] and r["verdict"]["skew_layers_within"] == 0


def test_fit_against_recording_and_grid_edge_warning(files, tmp_path, capsys):
    d, f = files
    doc = {"moejax_fit": 1, "family": "powerlaw", "method": "m", "source": "flat.npz",
           "num_experts": 8, "top_k": 2, "pooled": "powerlaw:alpha=0.05",
           "layers": ["powerlaw:alpha=0.05"], "moments_matched": [False]}
    fj = tmp_path / "fit.json"
    fj.write_text(json.dumps(doc))
    assert cli.main(["trace", "compare", str(fj), str(f["flat2"])]) == 0
    text = capsys.readouterr().out
    assert "fit (powerlaw" in text
    assert "warning: powerlaw: 1 of 1 layers ended on the edge of the search grid" in text
    assert "layer l uses fitted layer l mod 1" in text
    # a near-flat fit is close to a flat recording and far from a skewed one
    near = compare.compare(fj, f["flat2"])["verdict"]["skew_max_abs_err"]
    far = compare.compare(fj, f["hot"])["verdict"]["skew_max_abs_err"]
    assert near < 0.25 < 0.5 < far


def test_format_fit_warns_on_grid_edge():
    res = {"method": "m", "holdout": "h", "recorded_skew_mean": 4.0, "paper_specs": {},
           "families": {"normal": {"pooled": "normal:std=0.3", "layers": ["a", "b", "c"],
                                   "moments_matched": [True, False, False],
                                   "heldout": {"profile_tv": [0.1]},
                                   "verdict": fit.verdict({"skew_rel_err": [0.3],
                                                           "curve_rel_err": [0.0],
                                                           "curve_indep_rel_err": [0.0]})}}}
    text = fit.format_fit(res)
    assert "normal: 2 of 3 layers ended on the edge of the search grid (layers 1, 2)" in text


def test_compare_bad_input_one_line(files, tmp_path, capsys):
    _, f = files
    other = io.save(tmp_path / "e16.npz",
                    _recording(np.random.default_rng(1), np.full(16, 1 / 16)))
    out = tmp_path / "c.json"
    rc = cli.main(["trace", "compare", str(other), str(f["hot"]), "--json", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "num_experts=16" in err
    assert not out.exists()
