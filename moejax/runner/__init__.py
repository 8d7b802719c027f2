"""Layer 4, the runner: the engine (jit + vmap + scan), streaming, sweeps, multi-process
runs, the memory budget."""
