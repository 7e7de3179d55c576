"""Event sources: the live ones (NVML, DCGM, eBPF, Kubernetes attribution), the simulated fleet and
recorded files, each producing the input events of docs/definitions.md ("Inputs and what is refused")."""
