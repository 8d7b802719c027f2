"""One process of a 2-process test run (tests/test_distributed.py): joins the run once, then
runs several `moejax` commands in turn (`moejax.cli.main`, in-process), so the test pays one
interpreter start, one jax import and one rendezvous per process for all of them.

    python tests/two_process_worker.py PLAN.json RANK

PLAN.json: {"flags": [distributed flags without --process-id], "set": {"module.NAME": value},
"runs": [[argv...], ...]}. Prints one JSON line: the exit code of each run, in order.
"""

from __future__ import annotations

import importlib
import json
import sys


def main() -> int:
    plan = json.loads(open(sys.argv[1]).read())
    rank = sys.argv[2]
    for name, value in plan.get("set", {}).items():  # e.g. small Parquet parts
        mod, _, attr = name.rpartition(".")
        setattr(importlib.import_module(mod), attr, value)
    from moejax.cli.main import main as cli

    codes = [cli([*argv, *plan["flags"], "--process-id", rank]) for argv in plan["runs"]]
    print(json.dumps(codes), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
