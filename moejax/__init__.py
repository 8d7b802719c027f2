"""moejax: a JAX functional simulator and differentiable cost model for MoE inference."""

__version__ = "0.1.0"

import os as _os

import jax as _jax

# Float32 matrix products in full precision on every backend. On GPUs JAX's default for
# float32 dots is TensorFloat-32 (10-bit mantissa): on an H200 the EPS-MoE layer then
# differed from its plain-Python reference by 1e-4 relative (tests/test_epsmoe.py), and
# simulated times would depend on the backend. The products here are small (traffic and
# placement matrices), so full precision costs nothing measurable. A user's own
# JAX_DEFAULT_MATMUL_PRECISION wins.
if "JAX_DEFAULT_MATMUL_PRECISION" not in _os.environ:
    _jax.config.update("jax_default_matmul_precision", "highest")
