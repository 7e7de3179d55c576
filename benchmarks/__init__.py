"""Benchmarks (BENCHMARKS.md): each module measures one target against a baseline run side by side."""
