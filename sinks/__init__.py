"""Parquet output and the DuckDB views over it."""
