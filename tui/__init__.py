"""The terminal chat (`localcos chat`), installed as `localcos.tui`: the app, its widgets and screens."""
