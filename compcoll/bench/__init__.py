"""Benchmark harness: ``python -m compcoll.bench`` (also the ``compcoll-bench`` script)."""
