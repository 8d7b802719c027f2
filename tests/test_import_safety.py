"""Import that cannot silently go wrong, and the trace tools for held-out work: a `--field`
that matches nothing is an error (also with --ignore-unknown-fields); the token field lines
tokens up across layers; a trace without steps and a short last iteration get a warning and
an option; every import says what it mapped, dropped and assumed, and records its
provenance, which `trace slice / concat / split` keep."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from moejax.cli import main as cli
from moejax.trace import importers, tools
from moejax.trace import io as trace_io
from moejax.trace.core import from_ids

ROOT = Path(__file__).resolve().parents[1]
OLMOE = ROOT / "tests" / "data" / "olmoe"


def run_cli(argv, capsys):
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(rc, err, *words):
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in lines[0], (w, lines[0])


def mixtral_jsonl(path: Path, rng, steps=2, layers=2, tokens=5, shuffle=False, step=True):
    """Per-token records of a decoding recorder (its own names, `gating_probs` weights,
    `pos` token ids); `shuffle` writes each layer's tokens in a different order."""
    truth = rng.integers(0, 8, (steps, layers, tokens, 2))
    truth[..., 1] = (truth[..., 0] + 1 + rng.integers(0, 7, truth.shape[:-1])) % 8
    with open(path, "w") as f:
        f.write(json.dumps({"num_experts": 8, "top_k": 2}) + "\n")
        for s in range(steps):
            for layer in range(layers):
                order = rng.permutation(tokens) if shuffle else range(tokens)
                for t in order:
                    rec = {"layer_id": layer, "topk": truth[s, layer, t].tolist(),
                           "gating_probs": [0.7, 0.3], "pos": int(t) + 100 * s,
                           "model": "mixtral"}
                    if step:
                        rec["decode_step"] = s
                    f.write(json.dumps(rec) + "\n")
    return truth


FIELDS = {"layer": "layer_id", "experts": "topk", "weights": "gating_probs",
          "step": "decode_step"}


def field_args(**over) -> list[str]:
    """--field options of FIELDS with `over` replacing or adding mappings."""
    out = []
    for k, v in {**FIELDS, **over}.items():
        out += ["--field", f"{k}={v}"]
    return [*out, "--ignore-unknown-fields"]


MAP = field_args()


@pytest.mark.parametrize("over, words", [
    ({"token": "no_such_key"}, ("--field token=no_such_key", "'no_such_key' appears in none")),
    ({"weights": "gating_prob"}, ("--field weights=gating_prob", "gating_probs")),  # a typo
])
def test_a_field_matching_no_record_is_an_error(tmp_path, capsys, over, words):
    """Even with --ignore-unknown-fields: the typo'd weights would otherwise be uniform 1/k
    and the token mapping ignored, without a word."""
    src = tmp_path / "rec.jsonl"
    mixtral_jsonl(src, np.random.default_rng(0))
    out = tmp_path / "t.npz"
    rc, _, err = run_cli(["trace", "import", "--format", "jsonl", src, "--out", out,
                          "--quiet", *field_args(**over)], capsys)
    one_line_error(rc, err, *words)
    assert not out.exists()


def test_token_field_lines_tokens_up_across_layers(tmp_path, capsys):
    """Each layer writes its tokens in its own order: with the token field every slot holds
    the same token at every layer (by record order it would not)."""
    src = tmp_path / "rec.jsonl"
    truth = mixtral_jsonl(src, np.random.default_rng(1), shuffle=True)
    out = tmp_path / "t.npz"
    rc, stdout, _ = run_cli(["trace", "import", "--format", "jsonl", src, "--out", out,
                             "--quiet", *MAP, "--field", "token=pos"], capsys)
    assert rc == 0
    tr, meta = trace_io.load(out)
    np.testing.assert_array_equal(np.asarray(tr.expert_ids), truth)
    assert "token <- pos" in stdout and "dropped: model" in stdout
    prov = meta["provenance"]
    assert prov["format"] == "jsonl" and prov["source"] == [str(src)]
    assert prov["options"]["fields"]["token"] == "pos"
    # without the token field the records' order is taken, and the import says so
    rc, stdout, _ = run_cli(["trace", "import", "--format", "jsonl", src, "--out", out,
                             "--quiet", *MAP], capsys)
    assert rc == 0 and "assumed: no token field: tokens lined up across layers by record" \
        in stdout
    assert not np.array_equal(np.asarray(trace_io.load(out)[0].expert_ids), truth)


def test_a_token_twice_or_missing_at_a_layer_is_named(tmp_path, capsys):
    src = tmp_path / "rec.jsonl"
    mixtral_jsonl(src, np.random.default_rng(2))
    lines = src.read_text().splitlines()
    (tmp_path / "dup.jsonl").write_text("\n".join([*lines, lines[1]]) + "\n")
    rc, _, err = run_cli(["trace", "import", "--format", "jsonl", tmp_path / "dup.jsonl",
                          "--out", tmp_path / "t.npz", "--quiet", *MAP, "--field",
                          "token=pos"], capsys)
    one_line_error(rc, err, "token 0 routed twice at layer 0 of step 0")


def test_no_step_field_warns_and_tokens_per_iteration_cuts(tmp_path, capsys):
    src = tmp_path / "rec.jsonl"
    truth = mixtral_jsonl(src, np.random.default_rng(3), steps=3, step=False)
    out = tmp_path / "t.npz"
    base = ["trace", "import", "--format", "jsonl", src, "--out", out, "--quiet",
            "--field", "layer=layer_id", "--field", "experts=topk", "--field",
            "weights=gating_probs", "--field", "token=pos", "--ignore-unknown-fields"]
    rc, _, err = run_cli(base, capsys)
    assert rc == 0
    assert err.count("moejax: warning:") == 1 and "no step field in any record" in err
    assert trace_io.load(out)[0].num_iterations == 1  # kept, as warned
    rc, stdout, err = run_cli([*base, "--tokens-per-iteration", 5], capsys)
    assert rc == 0 and err == ""
    tr, _ = trace_io.load(out)
    np.testing.assert_array_equal(np.asarray(tr.expert_ids), truth)
    assert "assumed: no step field: iterations of 5 tokens cut in token-id order" in stdout
    # a short last iteration: warned and kept; --last-iteration drop drops it
    rc, _, err = run_cli([*base, "--tokens-per-iteration", 4], capsys)
    assert rc == 0 and "the last iteration holds 3 of 4 tokens" in err
    assert trace_io.load(out)[0].num_iterations == 4
    rc, stdout, err = run_cli([*base, "--tokens-per-iteration", 4, "--last-iteration", "drop"],
                              capsys)
    assert rc == 0 and err == "" and "the short last iteration (3 tokens)" in stdout
    assert trace_io.load(out)[0].num_iterations == 3
    rc, _, err = run_cli([*base, "--tokens-per-iteration", 4, "--last-iteration", "keep"],
                         capsys)
    assert rc == 0 and err == ""
    # steps recorded: --tokens-per-iteration would re-cut them, refused
    rc, _, err = run_cli(["trace", "import", "--format", "jsonl", src, "--out", out, "--quiet",
                          *MAP, "--tokens-per-iteration", 4], capsys)
    one_line_error(rc, err, "--field")  # decode_step is mapped but never appears


def test_esft_short_last_iteration(tmp_path, capsys):
    esft = tmp_path / "esft"
    esft.mkdir()
    for layer in (1, 2):
        (esft / f"expert_weights_{layer}.txt").write_text(
            "1\t2\t3\t4\t5\t6\t\t.5\t.5\t.5\t.5\t.5\t.5\n" * 1 + "3\t4\t1\t2\t\t.5\t.5\t.5\t.5\n")
    out = tmp_path / "t.npz"
    base = ["trace", "import", "--format", "esft", esft, "--experts", 8, "--top-k", 2,
            "--keep-last-token", "--out", out, "--quiet", "--tokens-per-iteration", 2]
    rc, stdout, err = run_cli(base, capsys)
    assert rc == 0 and "the last iteration holds 1 of 2 tokens" in err
    assert "assumed: line i of every layer file is the same sequence" in stdout
    assert trace_io.load(out)[0].num_iterations == 3
    rc, _, err = run_cli([*base, "--last-iteration", "drop"], capsys)
    assert rc == 0 and err == "" and trace_io.load(out)[0].num_iterations == 2
    rc, _, err = run_cli(["trace", "import", "--format", "esft", esft, "--out", out,
                          "--last-iteration", "drop", "--quiet"], capsys)
    one_line_error(rc, err, "--last-iteration", "--tokens-per-iteration")


def _olmoe(tmp_path, name):
    tr, meta = importers.import_trace("olmoe", [OLMOE / f"mistral_expert_counts_{name}.pkl"],
                                      num_experts=8, top_k=2)
    path = tmp_path / f"{name}.npz"
    trace_io.save(path, tr, meta)
    return path


def test_slice_concat_split_keep_provenance(tmp_path, capsys):
    c4, arxiv = _olmoe(tmp_path, "c4"), _olmoe(tmp_path, "arxiv")
    rc, _, _ = run_cli(["trace", "concat", c4, arxiv, arxiv, "--out", tmp_path / "x.npz"],
                       capsys)
    assert rc == 0
    x, meta = trace_io.load(tmp_path / "x.npz")
    a, b = trace_io.load(c4)[0], trace_io.load(arxiv)[0]
    np.testing.assert_array_equal(np.asarray(x.counts),
                                  np.concatenate([a.counts, b.counts, b.counts]))
    parts = meta["provenance"]["parts"]
    assert [p["file"] for p in parts] == [str(c4), str(arxiv), str(arxiv)]
    assert parts[0]["format"] == "olmoe"
    rc, stdout, _ = run_cli(["trace", "split", tmp_path / "x.npz", "--train-fraction", 0.34,
                             "--train", tmp_path / "tr.npz", "--heldout",
                             tmp_path / "ho.npz"], capsys)
    assert rc == 0
    ho, hmeta = trace_io.load(tmp_path / "ho.npz")
    assert ho.num_iterations == 2
    assert hmeta["provenance"]["derived"][-1] == ("split train fraction 0.34: held out = "
                                                  "iterations 1:3")
    rc, _, _ = run_cli(["trace", "slice", tmp_path / "x.npz", "--iterations", "1:",
                        "--layers", "0,2", "--out", tmp_path / "s.npz"], capsys)
    assert rc == 0
    s, smeta = trace_io.load(tmp_path / "s.npz")
    np.testing.assert_array_equal(np.asarray(s.counts), np.asarray(x.counts)[1:, [0, 2]])
    assert smeta["layers"] == [0, 15]  # the recorded layer ids follow the slice
    assert smeta["provenance"]["derived"][-1].startswith("slice iterations 1:3, layers 0,2")


def test_token_slice_and_concat_pad(tmp_path):
    src = tmp_path / "rec.jsonl"
    mixtral_jsonl(src, np.random.default_rng(4), steps=3, layers=2, tokens=5)
    tr, meta = importers.import_trace("jsonl", src, fields={
        "layer": "layer_id", "experts": "topk", "weights": "gating_probs",
        "step": "decode_step", "token": "pos"}, ignore_unknown=True)
    s, _ = tools.slice_trace(tr, meta, tokens="1:3")
    assert s.num_tokens == 2
    np.testing.assert_array_equal(np.asarray(s.expert_ids), np.asarray(tr.expert_ids)[:, :, 1:3])
    c, _ = tools.concat([(s, meta), (tr, meta)], ["s", "tr"])
    assert c.num_tokens == 5 and c.num_iterations == 6
    assert np.asarray(c.token_mask)[:3].sum(-1).tolist() == [2, 2, 2]
    np.testing.assert_array_equal(np.asarray(c.counts)[3:], np.asarray(tr.counts))


@pytest.mark.parametrize("argv, words", [
    (["slice", "{c4}", "--iterations", "0:5"], ("--iterations '0:5'", "STOP <= 1")),
    (["slice", "{c4}", "--layers", "3"], ("--layers '3'", "0..2")),
    (["slice", "{c4}", "--tokens", "0:2"], ("--tokens", "counts-only")),
    (["split", "{c4}", "--train-fraction", "0.5", "--train", "{t}/a.npz", "--heldout",
      "{t}/b.npz"], ("--train-fraction 0.5", "1 iterations")),
    (["concat", "{c4}", "{tok}"], ("concat", "num_experts")),
])
def test_tools_bad_input_one_line_nothing_written(tmp_path, capsys, argv, words):
    c4 = _olmoe(tmp_path, "c4")
    tok = tmp_path / "tok.npz"  # 16 experts: not joinable with c4's 8
    trace_io.save(tok, from_ids(np.zeros((1, 3, 2, 2), np.int32) + [0, 1],
                                np.full((1, 3, 2, 2), 0.5, np.float32), np.ones((1, 2), bool),
                                16), {})
    before = sorted(tmp_path.iterdir())
    argv = [a.format(c4=c4, t=tmp_path, tok=tok) for a in argv]
    if argv[0] != "split":
        argv += ["--out", str(tmp_path / "o.npz")]
    rc, _, err = run_cli(["trace", *argv], capsys)
    one_line_error(rc, err, *words)
    assert sorted(tmp_path.iterdir()) == before
