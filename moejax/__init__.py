"""moejax: a JAX functional simulator and differentiable cost model for MoE inference."""

__version__ = "0.1.0"
