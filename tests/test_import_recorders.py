"""Recordings as a new user brings them: files that are not UTF-8,
JSONL records without a layer, and per-token JSONL from a recorder that names fields its own
way, adds its own fields and drops records (so the layers of a step are ragged). Bad input is
checked through the CLI: exit code 2, one line naming file, line and field, nothing written.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from moejax.cli import main as cli
from moejax.trace import importers, io


def run_cli(argv, capsys):
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc, err, *words):
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for w in words:
        assert w in lines[0], (w, lines[0])


# ------------------------------------------------------------------ item 3: encodings


def _bad_inputs(tmp: Path) -> dict[str, tuple[list, tuple]]:
    """name -> (CLI argv, words the one-line error must hold)."""
    (tmp / "bad.toml").write_bytes(b'name = "chip"\nfamily = "x\xff"\n')
    (tmp / "bad.jsonl").write_bytes(b'{"layer": 0, "experts": [1, 2]}\n'
                                    b'{"layer": 0, "experts": [1, 2], "step": "\xfe"}\n')
    (tmp / "nolayer.jsonl").write_bytes(b'{"num_experts": 8, "top_k": 2}\n'
                                        b'{"layer": 0, "experts": [1, 2]}\n'
                                        b'{"experts": [3, 4]}\n')
    (tmp / "bad.csv").write_bytes(b"layer,0,1\n0,4,2\n1,3,\xe9\n")
    esft = tmp / "esft"
    esft.mkdir()
    (esft / "expert_weights_1.txt").write_bytes(b"1\t2\t\t0.5\t0.5\n")
    (esft / "expert_weights_2.txt").write_bytes(b"1\t2\t\t0.5\t0.\xff5\n")
    out = tmp / "out.npz"
    imp = ["trace", "import", "--out", out, "--quiet"]
    return {
        "toml": (["simulate", "--hardware", tmp / "bad.toml", "--traces", 2, "--out",
                  tmp / "sim"], ("bad.toml:2", "family", "0xff", "not UTF-8")),
        "jsonl": ([*imp, "--format", "jsonl", tmp / "bad.jsonl", "--experts", 8],
                  ("bad.jsonl:2", "step", "0xfe", "not UTF-8")),
        "jsonl-no-layer": ([*imp, "--format", "jsonl", tmp / "nolayer.jsonl"],
                           ("nolayer.jsonl:3", "layer", "missing")),
        "csv": ([*imp, "--format", "counts-csv", tmp / "bad.csv", "--top-k", 1],
                ("bad.csv:3", "count of expert 1", "0xe9", "not UTF-8")),
        "esft": ([*imp, "--format", "esft", esft, "--experts", 8, "--top-k", 2],
                 ("expert_weights_2.txt:1", "weights", "0xff", "not UTF-8")),
    }


@pytest.mark.parametrize("case", ["toml", "jsonl", "jsonl-no-layer", "csv", "esft"])
def test_bad_encoding_and_missing_layer_cli(tmp_path, capsys, case):
    argv, words = _bad_inputs(tmp_path)[case]
    before = sorted(p.name for p in tmp_path.rglob("*"))
    rc, _, err = run_cli(argv, capsys)
    assert_one_line_error(rc, err, *words)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written


def test_utf8_bom_is_accepted(tmp_path):
    p = tmp_path / "bom.jsonl"
    p.write_bytes(b'\xef\xbb\xbf{"num_experts": 8, "top_k": 2}\n{"layer": 0, "experts": [1, 2]}\n')
    tr, _ = importers.import_jsonl(p)
    assert tr.expert_ids.shape == (1, 1, 1, 2)


# ------------------------------------------------------------------ item 5: real recorders


def recorder_jsonl(path: Path, rng, steps=3, layers=3, tokens=6, e=8, k=2, drop=()):
    """Per-token records as a forward-hook recorder writes them: its own names
    (`iteration`, `layer_idx`, `routing.topk_ids`), extra fields (`dataset`, `text`), and
    records missing where `drop` holds (step, layer, token)."""
    truth = np.zeros((steps, layers, tokens, k), np.int64)
    with open(path, "w") as f:
        for s in range(steps):
            for layer in range(layers):
                for t in range(tokens):
                    ids = rng.choice(e, k, replace=False)
                    truth[s, layer, t] = ids
                    if (s, layer, t) in drop:
                        continue
                    w = rng.dirichlet(np.ones(k))
                    f.write(json.dumps({
                        "dataset": "gsm8k", "iteration": s, "layer_idx": layer,
                        "token_idx": t, "text": "é",
                        "routing": {"topk_ids": ids.tolist(), "topk_weights": w.tolist()},
                    }) + "\n")
    return truth


MAP = ["--field", "step=iteration", "--field", "layer=layer_idx",
       "--field", "experts=routing.topk_ids", "--field", "weights=routing.topk_weights",
       "--field", "token=token_idx"]


def test_recorder_fails_without_options_with_one_line(tmp_path, capsys):
    src = tmp_path / "rec.jsonl"
    recorder_jsonl(src, np.random.default_rng(0))
    out = tmp_path / "t.npz"
    rc, _, err = run_cli(["trace", "import", "--format", "jsonl", src, "--experts", 8,
                          "--out", out, "--quiet"], capsys)
    assert_one_line_error(rc, err, "rec.jsonl:1", "dataset", "unknown field",
                          "--ignore-unknown-fields")
    assert not out.exists()


def test_recorder_imports_with_field_map(tmp_path, capsys):
    src = tmp_path / "rec.jsonl"
    truth = recorder_jsonl(src, np.random.default_rng(1))
    out = tmp_path / "t.npz"
    rc, stdout, _ = run_cli(["trace", "import", "--format", "jsonl", src, "--experts", 8,
                             "--ignore-unknown-fields", *MAP, "--out", out, "--quiet"], capsys)
    assert rc == 0, stdout
    tr, meta = io.load(out)
    np.testing.assert_array_equal(np.asarray(tr.expert_ids), truth)
    assert meta["layers"] == [0, 1, 2]
    assert float(np.asarray(tr.gate_weights).sum()) == pytest.approx(3 * 3 * 6, rel=1e-5)


def test_ragged_layers_refused_then_truncated(tmp_path, capsys):
    src = tmp_path / "rec.jsonl"
    drop = {(0, 1, 5), (0, 2, 4), (0, 2, 5), (2, 0, 0)}
    truth = recorder_jsonl(src, np.random.default_rng(2), drop=drop)
    out = tmp_path / "t.npz"
    base = ["trace", "import", "--format", "jsonl", src, "--experts", 8,
            "--ignore-unknown-fields", *MAP, "--out", out, "--quiet"]
    rc, _, err = run_cli(base, capsys)
    # step 0: token 4 is routed at layers 0 and 1 but not at layer 2 (the token field
    # lines tokens up across layers by id, so the error names the token)
    assert_one_line_error(rc, err, "rec.jsonl:", "token 4 of step 0", "not at layer 2",
                          "--truncate-to-common")
    assert not out.exists()
    rc, stdout, _ = run_cli([*base, "--truncate-to-common"], capsys)
    assert rc == 0
    # step 0 keeps 4 of 6 (drops 2 + 1 + 0 present records = 3), step 2 keeps 5 (drops 2)
    assert "dropped 5 of" in stdout
    tr, meta = io.load(out)
    assert meta["dropped_tokens"] == 5
    np.testing.assert_array_equal(np.asarray(tr.token_mask).sum(-1), [4, 6, 5])
    ids = np.asarray(tr.expert_ids)
    np.testing.assert_array_equal(ids[1], truth[1])
    np.testing.assert_array_equal(ids[0, :, :4], truth[0, :, :4])
    # step 2, layer 0 lost token 0, so every layer keeps tokens 1..5 (by token id: slot j
    # holds the same token at every layer, not the j-th record of each layer)
    np.testing.assert_array_equal(ids[2, :, :5], truth[2, :, 1:])
    assert (ids[0, :, 4:] == -1).all()
    counts = np.asarray(tr.counts)
    assert counts.sum() == (4 + 6 + 5) * 3 * 2


@pytest.mark.parametrize("bad", ["layer", "layer=", "nope=x"])
def test_field_map_bad_option(tmp_path, capsys, bad):
    src = tmp_path / "rec.jsonl"
    recorder_jsonl(src, np.random.default_rng(3), steps=1, layers=1, tokens=1)
    rc, _, err = run_cli(["trace", "import", "--format", "jsonl", src, "--experts", 8,
                          "--field", bad, "--out", tmp_path / "t.npz", "--quiet"], capsys)
    assert_one_line_error(rc, err, "--field")
    assert not (tmp_path / "t.npz").exists()


def test_jsonl_options_refused_for_other_formats(tmp_path, capsys):
    rc, _, err = run_cli(["trace", "import", "--format", "counts-csv", tmp_path / "x.csv",
                          "--top-k", 1, "--truncate-to-common", "--out", tmp_path / "t.npz"],
                         capsys)
    assert_one_line_error(rc, err, "jsonl format only")


def test_counts_csv_fallback_from_ragged_recorder(tmp_path):
    """The docs' fallback: per-layer counts of a ragged recording, written as counts CSV,
    import losslessly as a counts-only trace."""
    rng = np.random.default_rng(4)
    src = tmp_path / "rec.jsonl"
    recorder_jsonl(src, rng, steps=1, drop={(0, 1, 2)})
    counts = np.zeros((3, 8), np.int64)
    for line in src.read_text().splitlines():
        r = json.loads(line)
        np.add.at(counts[r["layer_idx"]], r["routing"]["topk_ids"], 1)
    csv = tmp_path / "c.csv"
    csv.write_text("layer," + ",".join(map(str, range(8))) + "\n" + "".join(
        f"{layer}," + ",".join(map(str, row)) + "\n" for layer, row in enumerate(counts)))
    tr, _ = importers.import_counts_csv(csv, top_k=2)
    np.testing.assert_array_equal(np.asarray(tr.counts)[0], counts)
