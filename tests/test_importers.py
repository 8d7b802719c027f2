"""Importers of recorded routing (moejax.trace.importers), inspect extras, and the CLI path
import -> inspect -> simulate on the imported recording."""

from __future__ import annotations

import collections
import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from moejax.cli import main as cli
from moejax.errors import ConfigError, TraceError
from moejax.trace import analysis, importers, io

DATA = Path(__file__).parent / "data" / "olmoe"
MISTRAL_C4 = DATA / "mistral_expert_counts_c4.pkl"
MISTRAL_ARXIV = DATA / "mistral_expert_counts_arxiv.pkl"
MISTRAL_PAIRS = DATA / "mistral_expert_counts_crosslayer_top1_c4.pkl"


# ------------------------------------------------------------------------ ESFT


def esft_line(ids, w) -> str:
    ids, w = np.asarray(ids), np.asarray(w)
    return ("\t".join(str(x) for x in ids.ravel()) + "\t\t"
            + "\t".join(f"{x:.4f}" for x in w.ravel()) + "\n")


def write_esft(folder: Path, seqs, layers=2) -> Path:
    """seqs: list of (ids [T, L, K], weights [T, L, K]); writes expert_weights_<l>.txt."""
    folder.mkdir(parents=True, exist_ok=True)
    for layer in range(layers):
        with open(folder / f"expert_weights_{layer + 1}.txt", "w") as f:
            for ids, w in seqs:
                f.write(esft_line(ids[:, layer], w[:, layer]))
    return folder


def random_seqs(rng, lengths, layers=2, e=8, k=2):
    out = []
    for t in lengths:
        ids = np.stack([np.stack([rng.choice(e, k, replace=False) for _ in range(layers)])
                        for _ in range(t)])
        w = rng.uniform(0.05, 0.5, size=(t, layers, k))
        out.append((ids, w))
    return out


def test_esft_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    seqs = random_seqs(rng, [5, 3, 7])
    folder = write_esft(tmp_path / "task", seqs)
    tr, meta = importers.import_esft(folder, num_experts=8, top_k=2, drop_last_token=False)
    assert tr.expert_ids.shape == (3, 2, 7, 2)
    np.testing.assert_array_equal(np.asarray(tr.token_mask).sum(-1), [5, 3, 7])
    for i, (ids, w) in enumerate(seqs):
        np.testing.assert_array_equal(np.asarray(tr.expert_ids)[i, :, : len(ids)],
                                      ids.transpose(1, 0, 2))
        np.testing.assert_allclose(np.asarray(tr.gate_weights)[i, :, : len(ids)],
                                   w.transpose(1, 0, 2), atol=1e-4)
    assert (np.asarray(tr.token_request)[np.asarray(tr.token_mask)] >= 0).all()
    assert meta["tokens"] == 15 and meta["layers"] == [1, 2]
    # drop_last_token removes one token per sequence; packing keeps token order
    tr2, _ = importers.import_esft(folder, num_experts=8, top_k=2)
    np.testing.assert_array_equal(np.asarray(tr2.token_mask).sum(-1), [4, 2, 6])
    tr3, _ = importers.import_esft(folder, num_experts=8, top_k=2, drop_last_token=False,
                                   tokens_per_iteration=4, progress=True)
    assert tr3.expert_ids.shape == (4, 2, 4, 2)
    flat = np.asarray(tr3.expert_ids).transpose(0, 2, 1, 3).reshape(16, 2, 2)[:15]
    np.testing.assert_array_equal(flat, np.concatenate([s[0] for s in seqs]))
    np.testing.assert_array_equal(np.asarray(tr3.counts).sum((0, 2)), [30, 30])


def _corrupt(folder: Path, layer: int, line: int, new: str | None, end: str = "\n"):
    p = folder / f"expert_weights_{layer}.txt"
    lines = p.read_text().splitlines()
    if new is None:
        lines = lines[:line - 1]
    else:
        lines[line - 1] = new
    p.write_text("\n".join(lines) + (end if lines else ""))


@pytest.mark.parametrize(
    "case, words",
    [
        ("truncated_line", ["expert_weights_2.txt:2", "ids", "multiple of top_k"]),
        ("no_newline", ["expert_weights_1.txt:3", "truncated"]),
        ("id_out_of_range", ["expert_weights_1.txt:1", "ids", "out of range [0, 8)"]),
        ("nan_weight", ["expert_weights_2.txt:1", "weights", "non-finite"]),
        ("fewer_lines", ["expert_weights_2.txt:3", "truncated file"]),
        ("weight_count", ["expert_weights_1.txt:2", "weights", "weights for"]),
        ("token_mismatch", ["expert_weights_2.txt:1", "tokens"]),
        ("duplicate", ["expert_weights_1.txt:1", "same expert twice"]),
    ],
)
def test_esft_bad_input_names_file_line_field(tmp_path, case, words):
    rng = np.random.default_rng(1)
    folder = write_esft(tmp_path / "t", random_seqs(rng, [4, 4, 4]))
    if case == "truncated_line":
        text = (folder / "expert_weights_2.txt").read_text().splitlines()[1]
        ids, w = text.split("\t\t")
        _corrupt(folder, 2, 2, "\t".join(ids.split("\t")[:-1]) + "\t\t" + w)
    elif case == "no_newline":
        _corrupt(folder, 1, 3, (folder / "expert_weights_1.txt").read_text().splitlines()[2],
                 end="")
    elif case == "id_out_of_range":
        _corrupt(folder, 1, 1, esft_line([[9, 1]] + [[0, 1]] * 3, np.full((4, 2), 0.2)))
    elif case == "nan_weight":
        _corrupt(folder, 2, 1, esft_line([[2, 1]] * 4, np.full((4, 2), 0.2)).replace(
            "0.2000", "nan", 1))
    elif case == "fewer_lines":
        _corrupt(folder, 2, 3, None)
    elif case == "weight_count":
        line = esft_line([[2, 1]] * 4, np.full((4, 2), 0.2)).rstrip("\n")
        _corrupt(folder, 1, 2, line + "\t0.1000\t0.2000")
    elif case == "token_mismatch":
        _corrupt(folder, 2, 1, esft_line([[2, 1]] * 3, np.full((3, 2), 0.2)))
    elif case == "duplicate":
        _corrupt(folder, 1, 1, esft_line([[3, 3]] + [[0, 1]] * 3, np.full((4, 2), 0.2)))
    with pytest.raises(TraceError) as err:
        importers.import_esft(folder, num_experts=8, top_k=2)
    msg = str(err.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg


def test_esft_missing_layer_file_and_k_mismatch(tmp_path):
    rng = np.random.default_rng(2)
    folder = write_esft(tmp_path / "t", random_seqs(rng, [3, 3], layers=3), layers=3)
    with pytest.raises(TraceError, match="multiple of top_k=4"):  # k mismatch: 3*2 ids
        importers.import_esft(folder, num_experts=8, top_k=4)
    os.remove(folder / "expert_weights_2.txt")
    with pytest.raises(TraceError, match="expert_weights_2.txt"):
        importers.import_esft(folder, num_experts=8, top_k=2)
    zero = tmp_path / "zero"  # ESFT numbers layers from 1: a lone layer-0 file is named
    zero.mkdir()
    (zero / "expert_weights_0.txt").write_text("1\t2\t\t0.5\t0.5\n")
    with pytest.raises(TraceError, match="numbered from 1"):
        importers.import_esft(zero, num_experts=8, top_k=2)


# ------------------------------------------------------------------------ OLMoE


def test_olmoe_counts_excerpt():
    tr, meta = importers.import_olmoe([MISTRAL_C4, MISTRAL_ARXIV], num_experts=8, top_k=2)
    assert not tr.has_tokens
    assert tr.counts.shape == (2, 3, 8)
    # SOURCE.md: 208,896 tokens per domain, top-2 -> 417,792 selections per layer
    np.testing.assert_array_equal(np.asarray(tr.counts).sum(-1), 417_792)
    np.testing.assert_allclose(np.asarray(tr.tokens_per_iteration()), 208_896)
    assert meta["layers"] == [0, 7, 15]
    raw = importers.restricted_unpickle(MISTRAL_C4)
    np.testing.assert_array_equal(np.asarray(tr.counts)[0, 1],
                                  [raw[1][e] for e in range(8)])


def test_olmoe_pair_excerpt_keeps_affinity():
    tr, meta = importers.import_olmoe([MISTRAL_PAIRS], num_experts=8, top_k=1)
    pairs = np.asarray(meta["cross_layer_pairs"]["counts"])
    assert pairs.shape == (2, 8, 8) and meta["cross_layer_pairs"]["layers"] == [[0, 7], [7, 15]]
    assert pairs[0].sum() == 208_896
    # marginals of pair (0, 7) and (7, 15) agree on layer 7
    np.testing.assert_array_equal(pairs[0].sum(0), pairs[1].sum(1))
    np.testing.assert_array_equal(np.asarray(tr.counts)[0, 1], pairs[1].sum(1))
    aff = analysis.cross_layer_affinity(tr, meta)
    assert len(aff) == 2
    for a in aff:
        assert 0 <= a["nmi"] <= 1 and a["predictability"] >= a["baseline"]


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/moejax_pickle_was_executed",))


def test_olmoe_disallowed_pickle_type_is_rejected_not_run(tmp_path):
    marker = Path("/tmp/moejax_pickle_was_executed")
    marker.unlink(missing_ok=True)
    p = tmp_path / "evil.pkl"
    p.write_bytes(pickle.dumps([collections.Counter({1: 2}), _Evil()]))
    with pytest.raises(TraceError) as err:
        importers.import_olmoe([p], num_experts=8, top_k=2)
    msg = str(err.value)
    assert "evil.pkl" in msg and "disallowed type" in msg and "system" in msg
    assert "collections.Counter" in msg  # lists what is allowed
    assert not marker.exists()


@pytest.mark.parametrize(
    "obj, kw, words",
    [
        ([collections.Counter({9: 4})], {}, ["expert id out of range [0, 8)"]),
        ([collections.Counter({1: 3})], {}, ["multiple of top_k=2"]),
        ([collections.Counter({1: float("nan")})], {}, ["count", "finite"]),
        ({"a": 1}, {}, ["list of collections.Counter"]),
        ([collections.Counter({1: 2}), collections.Counter({1: 4})], {}, ["different totals"]),
    ],
)
def test_olmoe_bad_content(tmp_path, obj, kw, words):
    p = tmp_path / "bad.pkl"
    p.write_bytes(pickle.dumps(obj))
    with pytest.raises(TraceError) as err:
        importers.import_olmoe([p], num_experts=8, top_k=2, **kw)
    for w in words:
        assert w in str(err.value)


def test_olmoe_truncated_pickle_and_wrong_experts(tmp_path):
    p = tmp_path / "cut.pkl"
    p.write_bytes(MISTRAL_C4.read_bytes()[:300])
    with pytest.raises(TraceError, match="cut.pkl: pickle: unreadable"):
        importers.import_olmoe([p], num_experts=8, top_k=2)
    with pytest.raises(TraceError, match=r"out of range \[0, 4\)"):
        importers.import_olmoe([MISTRAL_C4], num_experts=4, top_k=2)
    with pytest.raises(ConfigError, match="--experts 64 --top-k 8"):
        importers.import_trace("olmoe", [MISTRAL_C4])


# ------------------------------------------------------------------------ JSONL


def test_jsonl_per_token_and_per_step(tmp_path):
    p = tmp_path / "r.jsonl"
    recs = [{"num_experts": 8, "top_k": 2}]
    for step in (5, 3):  # out of order on purpose: steps are sorted
        for layer in (0, 1):
            for t in range(3 if step == 3 else 2):
                recs.append({"step": step, "layer": layer, "experts": [t, 7 - layer],
                             "weights": [0.7, 0.3], "request": 10 + t})
    p.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    tr, meta = importers.import_jsonl(p)
    assert tr.expert_ids.shape == (2, 2, 3, 2)
    np.testing.assert_array_equal(np.asarray(tr.token_mask).sum(-1), [3, 2])
    np.testing.assert_array_equal(np.asarray(tr.expert_ids)[0, 1, :, 0], [0, 1, 2])
    np.testing.assert_array_equal(np.asarray(tr.expert_ids)[0, 1, :, 1], [6, 6, 6])
    np.testing.assert_array_equal(np.asarray(tr.token_request)[1], [10, 11, -1])
    assert meta["steps"] == [3, 5]
    # the same routing as per-step records
    q = tmp_path / "s.jsonl"
    rows = [{"step": s, "layer": layer,
             "experts": [[t, 7 - layer] for t in range(3 if s == 3 else 2)],
             "weights": [[0.7, 0.3]] * (3 if s == 3 else 2),
             "requests": [10 + t for t in range(3 if s == 3 else 2)]}
            for s in (5, 3) for layer in (0, 1)]
    q.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    tr2, _ = importers.import_jsonl(q, num_experts=8)
    for a, b in zip((tr.expert_ids, tr.gate_weights, tr.token_request, tr.counts),
                    (tr2.expert_ids, tr2.gate_weights, tr2.token_request, tr2.counts),
                    strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize(
    "lines, words",
    [
        (['{"layer": 0, "experts": [1, 2]', ], ["r.jsonl:2", "truncated record"]),
        (['{"layer": 0, "experts": [1, 2, 3]}'], ["r.jsonl:2", "experts", "top_k=2"]),
        (['{"layer": 0, "experts": [1, 9]}'], ["r.jsonl:2", "out of range [0, 8)"]),
        (['{"layer": 0, "experts": [1, 2], "weights": [NaN, 0.1]}'],
         ["r.jsonl:2", "weights", "non-finite"]),
        (['{"layer": 0, "experts": [1, 2], "weight": [1, 1]}'], ["r.jsonl:2", "weight",
                                                                  "unknown field"]),
        (['{"layer": -1, "experts": [1, 2]}'], ["r.jsonl:2", "layer", ">= 0"]),
        (['{"layer": 0, "experts": [1, 2]}', '{"layer": 0, "experts": [1, 3]}',
          '{"layer": 1, "experts": [1, 2]}'], ["layer", "same tokens"]),
        (['{"layer": 0, "experts": [1, 2], "weights": [0.5, 0.5]}',
          '{"layer": 1, "experts": [1, 2]}'], ["r.jsonl:3", "weights", "some records"]),
    ],
)
def test_jsonl_bad_input(tmp_path, lines, words):
    p = tmp_path / "r.jsonl"
    text = "\n".join(['{"num_experts": 8, "top_k": 2}', *lines])
    p.write_text(text if "truncated record" in words else text + "\n")
    with pytest.raises(TraceError) as err:
        importers.import_jsonl(p)
    msg = str(err.value)
    for w in words:
        assert w in msg, msg


def test_jsonl_needs_num_experts(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text('{"layer": 0, "experts": [1, 2]}\n')
    with pytest.raises(TraceError, match="num_experts"):
        importers.import_jsonl(p)


# ------------------------------------------------------------------------ counts CSV


def test_counts_csv(tmp_path):
    p = tmp_path / "c.csv"
    p.write_text("iteration,layer,0,1,2,3\n0,0,4,2,2,0\n0,1,1,1,3,3\n1,0,8,0,0,0\n1,1,2,2,2,2\n")
    tr, _ = importers.import_counts_csv(p, top_k=1)
    assert tr.counts.shape == (2, 2, 4) and not tr.has_tokens
    np.testing.assert_array_equal(np.asarray(tr.counts)[1, 0], [8, 0, 0, 0])
    q = tmp_path / "d.csv"
    q.write_text("layer,0,1\n0,3,1\n1,2,2\n")
    tr2, _ = importers.import_trace("counts-csv", [q], top_k=1, num_experts=2)
    assert tr2.counts.shape == (1, 2, 2)


@pytest.mark.parametrize(
    "text, words",
    [
        ("layer,0,1\n0,3,1\n1,2", ["c.csv:3", "row", "truncated"]),
        ("layer,0,1\n0,3,-1\n", ["c.csv:2", "count of expert 1", ">= 0"]),
        ("layer,0,1\n0,3,nan\n", ["c.csv:2", "count of expert 1"]),
        ("layer,0,2\n0,3,1\n", ["c.csv:1", "header", "0,1,...,E-1"]),
        ("iteration,layer,0,1\n0,0,1,1\n1,1,1,1\n", ["(iteration, layer)", "no row"]),
        ("layer,0,1\n0,1,1\n0,2,2\n", ["c.csv:3", "given twice"]),
        ("layer,0,1,2\n0,1,1,1\n", ["3 expert columns", "num_experts=2"]),
    ],
)
def test_counts_csv_bad_input(tmp_path, text, words):
    p = tmp_path / "c.csv"
    p.write_text(text)
    with pytest.raises(TraceError) as err:
        importers.import_counts_csv(p, top_k=1, num_experts=2)
    for w in words:
        assert w in str(err.value), str(err.value)


def test_unknown_format_lists_formats():
    with pytest.raises(ConfigError, match="esft, olmoe, jsonl, counts-csv"):
        importers.import_trace("vllm", ["x"])


# ------------------------------------------------------------------------ analysis


def test_activated_curve_matches_formula_and_brute_force(tmp_path):
    rng = np.random.default_rng(3)
    seqs = random_seqs(rng, [40, 24], layers=2, e=8, k=2)
    tr, _ = importers.import_esft(write_esft(tmp_path / "a", seqs), num_experts=8, top_k=2,
                                  drop_last_token=False)
    a = analysis.activated_curve(tr, ms=(1, 4, 16))
    ids = np.concatenate([s[0] for s in seqs])  # [M, L, K]
    for j, m in enumerate((1, 4, 16)):
        w = len(ids) // m
        brute = [np.mean([len(np.unique(ids[i * m:(i + 1) * m, layer])) for i in range(w)])
                 for layer in range(2)]
        np.testing.assert_allclose(np.asarray(a["measured"])[:, j], brute)
    # uniform shares reproduce 003 §3.2's formula exactly
    np.testing.assert_allclose(analysis.activated_from_shares(np.full(8, 1 / 8), [1, 4, 16], 2),
                               a["uniform"])
    loc = analysis.temporal_locality(tr)
    assert loc["iterations"] == 2 and np.isnan(loc["consecutive"]).all()


# ------------------------------------------------------------------------ CLI


def test_cli_import_inspect_simulate_counts_only(tmp_path, capsys):
    out = tmp_path / "m.npz"
    assert cli.main(["trace", "import", "--format", "olmoe", str(MISTRAL_C4),
                     str(MISTRAL_ARXIV), "--experts", "8", "--top-k", "2", "--out", str(out),
                     "--quiet"]) == 0
    tr, meta = io.load(out)
    assert tr.counts.shape == (2, 3, 8) and meta["source"] == "olmoe"
    png = tmp_path / "m.png"
    assert cli.main(["trace", "inspect", str(out), "--plot", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    text = capsys.readouterr().out
    assert "activated experts per layer vs batch size" in text
    assert cli.main(["simulate", "--trace", str(out), "--model", "mixtral-8x7b",
                     "--hardware", "chiplet-2x2", "--policy", "ep", "--quiet"]) == 0
    # the default model has 128 experts: a one-line error naming both, exit code 2
    assert cli.main(["simulate", "--trace", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "num_experts=8" in err and "num_experts=128" in err and "\n" not in err


def test_cli_import_errors_are_one_line(tmp_path, capsys):
    p = tmp_path / "evil.pkl"
    p.write_bytes(pickle.dumps([_Evil()]))
    rc = cli.main(["trace", "import", "--format", "olmoe", str(p), "--experts", "8",
                   "--top-k", "2", "--out", str(tmp_path / "x.npz"), "--quiet"])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert "disallowed type" in err and "\n" not in err
    assert not (tmp_path / "x.npz").exists()
