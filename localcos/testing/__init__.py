"""For tests and benchmarks only; nothing in the product imports this package: NumPy stand-ins
for llama.cpp models, child processes on 127.0.0.1 (rpc-server, serve), llama.cpp's own test
vocabularies and tools, and the decoder's invariants checked every round."""
