#!/usr/bin/env bash
# The speed checks that need a GPU, as one script for a session that is lent one: each
# system's first and second call (bench_compile.py), the wafer layer's 8,192-trace program
# (target: compiled in under 30 s), and generated traces (bench_gen.py: version 3 on the
# device against the EP engine, and a million-trace `moejax simulate` end to end; target:
# >= 50% of the engine's rate). Run from the repository root on a machine with a CUDA jaxlib:
#
#     bash benchmarks/gpu_speed.sh [OUTDIR]      # PYTHON=... to pick the interpreter
#
# About 8 minutes on an H100-class GPU with the default sizes; each step has its own timeout
# (T_* variables). DEVICE=cpu and smaller sizes (SYSTEMS, WAFER_TRACES, GEN_TRACES,
# E2E_TRACES) run the same steps on a CPU, to check the script itself.
set -uo pipefail
out=${1:-${OUT:-gpu_speed}}
mkdir -p "$out"
py=${PYTHON:-python3}
dev=${DEVICE:-gpu}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} MOEJAX_COMPILATION_CACHE=off
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
  $py -c "import jax; print('jax', jax.__version__, jax.devices())"; } 2>&1 | tee "$out/env.txt"
timeout "${T_COMPILE:-240}" $py benchmarks/bench_compile.py --device "$dev" --no-warm \
    --systems "${SYSTEMS:-ep,fsedp,hydra,wafer,rebalancing,dysharp,epsmoe}" 2>&1 \
    | tee "$out/compile.txt"
timeout "${T_WAFER:-200}" $py benchmarks/bench_compile.py --device "$dev" --no-warm \
    --systems wafer --traces "${WAFER_TRACES:-8192}" 2>&1 | tee "$out/compile_wafer.txt"
timeout "${T_GEN:-200}" $py benchmarks/bench_gen.py --device "$dev" --traces "${GEN_TRACES:-65536}" \
    --v1-traces 1024 --rounds 2 --end-to-end "${E2E_TRACES:-1000000}" 2>&1 | tee "$out/gen.txt"
