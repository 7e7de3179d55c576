"""Parquet output and the DuckDB views over it."""

if __name__ != "gpucost.sinks":  # the top-level folder is a link for readers, not a second package
    raise ImportError(f"import gpucost.sinks, not {__name__}: one module under two names is two modules")
