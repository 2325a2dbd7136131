"""The decoding core, in NumPy: how distributions combine (`combiners`), how tokens are sampled
(`sampling`), how drafts are verified (`verify`), the four decoding strategies over one shared
state (`decoding`), incremental text with stop strings (`text`), and the expected-speed model with
the ``--gamma auto`` controller (`speedmodel`). See docs/algorithm.md.

Nothing here imports llama.cpp: the strategies drive models through `localcos.backend.Model`'s
interface (evaluate, truncate, tokens), so a NumPy stand-in works as well.
"""
