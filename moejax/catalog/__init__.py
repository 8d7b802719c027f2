"""Layer 1: where the catalogs live and their typed readers (platforms, models, policies)."""
