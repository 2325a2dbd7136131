"""Model files: where they come from (models.toml, the hub, packages on the package index), what
they are (their GGUF header), and the ones localcos makes (synthetic models, quantised copies)."""
