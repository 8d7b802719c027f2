"""`moejax simulate` with the stream-serving policies (002): runs, and bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path

from moejax.catalog.policies import load_policy
from moejax.cli.main import main


def test_policies_load():
    for name in ("aep-defrag", "aep-mtfs", "aep-flfs"):
        assert load_policy(name).system == "aep"
    assert load_policy("ep-sync").system == "ep_serving"


def test_simulate_ep_sync(tmp_path, capsys):
    rc = main(["simulate", "--hardware", "a100x8-nvswitch", "--model", "mixtral-8x7b",
               "--policy", "ep-sync", "--rate", "200", "--workload", "short",
               "--requests", "6", "--out", str(tmp_path)])
    assert rc == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["all_done"] and s["throughput_tok_s"]["mean"] > 0


def test_simulate_needs_rate_and_known_workload(capsys):
    base = ["simulate", "--hardware", "a100x8-nvswitch", "--model", "mixtral-8x7b",
            "--policy", "aep-defrag", "--requests", "4"]
    assert main(base) == 2
    assert "--rate" in capsys.readouterr().err
    assert main([*base, "--rate", "10", "--workload", "huge"]) == 2
    assert "short, medium, reasonable" in capsys.readouterr().err


def test_simulate_rejects_trace_file(tmp_path, capsys):
    f = tmp_path / "t.npz"
    f.write_bytes(b"not read")
    rc = main(["simulate", "--hardware", "a100x8-nvswitch", "--model", "mixtral-8x7b",
               "--policy", "aep-mtfs", "--rate", "100", "--workload", "medium",
               "--trace", str(f)])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert "--trace" in err and "request stream" in err and len(err.splitlines()) == 1


def test_policy_option_path_picks_the_engine_system(tmp_path, capsys):
    """The AEP option `path` (rounds | core | scan) picks the System the engine runs (no
    global table); a bad value is one line naming the allowed ones."""
    from moejax.systems.amoe import serve

    made = {p: serve.build("a100x8-nvswitch", "mixtral-8x7b", "aep-defrag", 4,
                           overrides={"path": p})[0] for p in ("rounds", "core", "scan")}
    assert [s.init.__qualname__.split(".")[0] for s in made.values()] == [
        "_rounds_system", "core_system", "build"]
    text = (Path(__file__).parents[1] / "policies" / "aep-defrag.toml").read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace("[options]\n", '[options]\npath = "bogus"\n'))
    assert main(["simulate", "--hardware", "a100x8-nvswitch", "--model", "mixtral-8x7b",
                 "--policy", str(bad), "--rate", "10", "--requests", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "path" in err and "rounds, core, scan" in err, err
