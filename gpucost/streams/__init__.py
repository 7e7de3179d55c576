"""Pure incremental operators: events and settings in, records out; no I/O, no transport, no wall clock."""

if __name__ != "gpucost.streams":  # the top-level folder is a link for readers, not a second package
    raise ImportError(f"import gpucost.streams, not {__name__}: one module under two names is two modules")
