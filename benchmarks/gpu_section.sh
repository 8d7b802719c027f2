#!/usr/bin/env bash
# The GPU section of docs/performance.md: EP, FSE-DP and the wafer layer at 1 / 1k / 64k traces
# (bench_backends.py) and the AMoE rounds path on 1 / 1k / 64k request streams (bench_amoe.py
# --rounds), on the default GPU. Run from the repository root on a machine with a CUDA jaxlib:
#
#     bash benchmarks/gpu_section.sh [OUTDIR]       # PYTHON=... to pick the interpreter
#
# The 2-core CPU numbers to divide by come from the same two scripts with --device cpu.
set -uo pipefail
out=${1:-${OUT:-gpu_section}}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/env.txt"
$py -c "import jax, flax, optax, numba; print('jax', jax.__version__, 'flax', flax.__version__, \
'optax', optax.__version__, 'numba', numba.__version__, jax.devices())" 2>&1 | tee -a "$out/env.txt"
timeout "${T_BACKENDS:-300}" $py benchmarks/bench_backends.py --device gpu \
    --sizes "${SIZES:-1,1024,65536}" 2>&1 | tee "$out/backends_gpu.txt"
# the same at 64k with the traces already on the GPU (no host-to-device copy per chunk)
timeout "${T_BACKENDS:-300}" $py benchmarks/bench_backends.py --device gpu --resident \
    --sizes 65536 2>&1 | tee "$out/backends_gpu_resident.txt"
# the dispatch histogram's counts: int16 (CPU's choice) vs int32 on the GPU, and the EP call
timeout "${T_BINCOUNT:-120}" $py benchmarks/bench_bincount.py --device gpu 2>&1 | tee "$out/bincount_gpu.txt"
for b in ${AMOE_BATCHES:-1024 65536}; do
  timeout "${T_AMOE:-90}" $py benchmarks/bench_amoe.py --rounds --device gpu --requests 200 \
      --batch "$b" --chunk-rounds 200 --events 1024 2>&1 | tee "$out/amoe_gpu_$b.txt"
done
