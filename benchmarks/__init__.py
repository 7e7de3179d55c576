"""Benchmarks of issue 6: each module measures one target against a baseline run side by side."""
