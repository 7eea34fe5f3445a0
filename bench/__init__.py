"""Benchmarks: zeptograd against numpy and torch (`python -m bench`, see bench/run.py)."""
