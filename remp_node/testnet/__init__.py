"""Whole REMP networks for tests, benchmarks and the demo: in memory with a fake clock
(sim, network) and as real processes on 127.0.0.1 (localnet)."""
