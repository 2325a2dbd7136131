"""Tools built on the Ensemble API: the benchmark, models.toml and the hub, GGUF inspection,
synthetic test models, and scoring."""
