"""moejax: a JAX functional simulator and differentiable cost model for MoE inference."""

__version__ = "0.1.0"

import os as _os

# LLVM's instruction selector at -O0: SelectionDAG, which fuses a*b+c into an FMA as -O2
# does, not FastISel, which does not. The default compile (-O2) never uses FastISel, so
# this changes nothing there; it makes `programs.quick_compile` (XLA at -O0) round as the
# default compile does. XLA reads XLA_FLAGS when JAX starts its backend: moejax imported
# after JAX's first computation leaves it unset, and quick compiles are refused. A user's
# own xla_backend_extra_options wins.
if "xla_backend_extra_options" not in _os.environ.get("XLA_FLAGS", ""):
    _os.environ["XLA_FLAGS"] = (_os.environ.get("XLA_FLAGS", "")
                                + " --xla_backend_extra_options=-fast-isel=false").strip()

import jax as _jax  # noqa: E402  (after XLA_FLAGS)

# Float32 matrix products in full precision on every backend. On GPUs JAX's default for
# float32 dots is TensorFloat-32 (10-bit mantissa): on an H200 the EPS-MoE layer then
# differed from its plain-Python reference by 1e-4 relative (tests/test_epsmoe.py), and
# simulated times would depend on the backend. The products here are small (traffic and
# placement matrices), so full precision costs nothing measurable. A user's own
# JAX_DEFAULT_MATMUL_PRECISION wins.
if "JAX_DEFAULT_MATMUL_PRECISION" not in _os.environ:
    _jax.config.update("jax_default_matmul_precision", "highest")
