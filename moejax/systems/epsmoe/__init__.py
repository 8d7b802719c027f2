"""EPS-MoE (paper 003): parallel modes, GEMM kernel switch, expert pipeline, SM split."""
