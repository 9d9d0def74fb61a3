"""Benchmarks whose figures BENCHMARKS.md quotes; run each from the repository root as `python -m bench.<name>`."""
