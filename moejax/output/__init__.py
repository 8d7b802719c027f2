"""Layer 0: result files written atomically, staged folders, output paths, plots, progress."""
