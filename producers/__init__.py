"""Event sources: the simulated fleet and recorded files (NVML, eBPF, dcgm in later work)."""
