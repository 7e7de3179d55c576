"""The leaf package: event and record models, Arrow schemas, encodings."""

if __name__ != "gpucost.schemas":  # the top-level folder is a link for readers, not a second package
    raise ImportError(f"import gpucost.schemas, not {__name__}: one module under two names is two modules")
