"""Event sources: the live ones (NVML, DCGM, eBPF, Kubernetes attribution), the simulated fleet and
recorded files, each producing the input events of docs/definitions.md ("Inputs and what is refused")."""

if __name__ != "gpucost.producers":  # the top-level folder is a link for readers, not a second package
    raise ImportError(f"import gpucost.producers, not {__name__}: one module under two names is two modules")
