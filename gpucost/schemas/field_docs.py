"""What each field of the events and records means, and its unit: the words the JSON Schemas carry for
consumers in other languages (``gpucost topics schemas``). One entry per field name, since a name means
the same in every event and record that has it; docs/definitions.md is the full definition of each.
"""

from __future__ import annotations

__all__ = ["FIELD_DOCS", "SCHEMA_VERSION", "UNITS"]

#: the version of the wire format the schemas describe; raised when a field changes meaning or type, so that a
#: consumer can refuse a producer newer than itself. Adding an optional field does not raise it.
SCHEMA_VERSION = 1

NS = "ns"  # integer nanoseconds since the Unix epoch, UTC (a time), or a duration in ns
MS = "ms"
MICRO_USD = "micro_usd"
#: every unit a field may name, in words
UNITS = {
    NS: "integer nanoseconds since the Unix epoch, UTC",
    MS: "integer milliseconds (a duration)",
    MICRO_USD: "integer micro-US-dollars (1 USD = 1,000,000)",
    "usd_per_gpu_hour": "US dollars per GPU-hour, a decimal",
    "percent": "percent, 0 to 100",
    "fraction": "a ratio, 0 to 1 unless said",
    "bytes": "bytes",
    "bytes_per_s": "bytes per second",
    "watts": "watts",
    "celsius": "degrees Celsius",
    "microjoules": "microjoules (mW · ms)",
    "tops": "tera-operations per second (dense FP16 tensor)",
    "kw_per_tops": "kilowatts per effective TOPS",
    "bits": "bits (Shannon entropy)",
    "seconds": "seconds",
    "flops": "floating-point operations",
    "count": "a count",
}

#: field name → (unit or None, description)
FIELD_DOCS: dict[str, tuple[str | None, str]] = {
    "kind": (None, "what the line or record is: its event kind, or 'dlq' for a dead letter"),
    "node_id": (None, "the node (host) the GPU or process runs on"),
    "gpu_uuid": (None, "the GPU's UUID as NVML reports it"),
    "ts_ns": (NS, "event time: when it happened on the node"),
    "interval_s": ("seconds", "the time the sample stands for (rounded to integer ms on the way in)"),
    "sm_util_pct": ("percent", "streaming multiprocessor utilisation over the interval"),
    "mem_bw_util_pct": ("percent", "memory bandwidth utilisation over the interval"),
    "mem_used_bytes": ("bytes", "device memory in use"),
    "gpu_model": (None, "the GPU's model name, which prices and peak TOPS are looked up by"),
    "mem_total_bytes": ("bytes", "device memory in all"),
    "power_w": ("watts", "power draw (rounded to integer mW on the way in)"),
    "temp_c": ("celsius", "GPU temperature"),
    "pcie_tx_bytes_s": ("bytes_per_s", "PCIe transmit throughput"),
    "pcie_rx_bytes_s": ("bytes_per_s", "PCIe receive throughput"),
    "tensor_active_pct": ("percent", "tensor core activity (DCGM profiling / NVML GPM), if measured"),
    "dram_active_pct": ("percent", "DRAM activity (DCGM profiling / NVML GPM), if measured"),
    "pid": (None, "the process id on its node (0 in an efficiency record: the GPU as a whole)"),
    "address": (None, "a memory address the process touched (an unsigned integer)"),
    "hops": ("count", "NUMA hops of the access"),
    "latency_weight": ("count", "the access's NUMA latency weight"),
    "flops_64b": ("flops", "what the trace counts: threads launched (launch) or one BLAS call's FLOPs (blas)"),
    "trace_source": (None, "what flops_64b counts: launch or blas"),
    "team": (
        None,
        "the tenant's team; 'idle' for unused capacity, 'unattributed' for processes with no binding, "
        "'unallocated' for capacity no allocation held (allocation basis)",
    ),
    "env": (None, "the tenant's environment (prod, staging…), if bound"),
    "app": (None, "the tenant's application, if bound"),
    "tier": (None, "the tenant's tier label, if bound"),
    "sla": (None, "the tenant's SLA tier name (Gold, Silver, Bronze…), if bound"),
    "git_commit": (None, "the tenant's git commit, if bound"),
    "ci_pipeline_id": (None, "the tenant's CI pipeline id, if bound"),
    "origin": (None, "where the binding came from (a file, the process environment, Kubernetes, Slurm)"),
    "usd_per_gpu_hour": ("usd_per_gpu_hour", "the GPU model's price in force (null: unpriced)"),
    "key_id": (None, "the price authority key that signed the price"),
    "signature": (
        None,
        "HMAC-SHA256, lowercase hex: of a price's model, time and rate; of a health record's "
        "snapshot_sha256 text (null: unsigned)",
    ),
    "pane_start_ns": (NS, "start of the pane [start, end): a pane_s-long interval of event time, epoch-aligned"),
    "pane_end_ns": (NS, "end of the pane (exclusive)"),
    "idle_ms": (MS, "covered time whose GPU samples were below the idle threshold"),
    "covered_ms": (MS, "time covered by GPU samples (the sum of their intervals)"),
    "idle_ms_72h": (MS, "idle_ms summed over the GPU's closed panes ending in the last 72 h"),
    "covered_ms_72h": (MS, "covered_ms summed over the GPU's closed panes ending in the last 72 h"),
    "idle_index_72h": ("fraction", "idle_ms_72h / covered_ms_72h"),
    "revision": ("count", "0 when first published; n for the pane's n-th revision by late data"),
    "first_ts_ns": (NS, "time of the window's first address"),
    "last_ts_ns": (NS, "time of the window's last address"),
    "n": ("count", "addresses binned in the window"),
    "out_of_range": ("count", "addresses of the window outside [mae_lo, mae_hi)"),
    "mae_bits": ("bits", "memory-access entropy of the window's address histogram"),
    "l2_evictions_per_1k_est": ("count", "estimated L2 evictions per 1,000 accesses (an interpolation)"),
    "record_id": (
        None,
        "the record's identity: a hash of (gpu_uuid, pane_start_ns, tenant_key, revision); count each once",
    ),
    "tenant_key": (None, "team:env:app:tier:sla:git_commit:ci_pipeline_id (missing values empty), or idle"),
    "t_share": ("fraction", "the tenant's share of SM time in the pane"),
    "b_share": ("fraction", "the tenant's share of memory bandwidth in the pane"),
    "l_share": ("fraction", "the tenant's share of NUMA latency weight in the pane"),
    "weight": ("fraction", "α·t_share + β·b_share + γ·l_share"),
    "busy_fraction": ("fraction", "the pane's busy fraction u (min 1)"),
    "pane_cost_micro_usd": (MICRO_USD, "the whole pane's cost C, split among its parties"),
    "cost_micro_usd": (
        MICRO_USD,
        "this party's cost; in a revision, the difference from its previous total: sum "
        "every record, each record_id once",
    ),
    "unpriced": (None, "true when the GPU model had no price (cost 0)"),
    "t_num": ("count", "exact Σ sm_util_cp · interval_ms of the tenant's process samples"),
    "b_num": ("count", "exact Σ mem_bw_util_cp · interval_ms of the tenant's process samples"),
    "l_num": ("count", "exact Σ hops · latency_weight of the tenant's NUMA events"),
    "allocation_id": (None, "the scheduler's id of one hold on one device (a pod's container and device, a Slurm job)"),
    "end_ts_ns": (NS, "when the hold ended; absent while it is held"),
    "sharing": (
        None,
        "how the device is shared: exclusive, mig (a MIG instance, held whole), mps, time_slicing or hami; "
        "a record lists its party's modes, comma-separated",
    ),
    "fraction_num": ("count", "the numerator of the share of the device held (e.g. an MPS percentage)"),
    "fraction_den": ("count", "the denominator of the share of the device held (e.g. 100, or the replicas)"),
    "allocations": ("count", "how many holds of the party cover part of the pane"),
    "allocated_share": ("fraction", "the party's share of the pane's cost on the allocation basis"),
    "allocated_fraction": ("fraction", "the party's mean fraction of the device held over the pane"),
    "cost_basis": (None, "what the split follows: 'allocation' (what was held) or 'usage' (what was used)"),
    "allocated_num": ("count", "exact Σ fraction × held ns of the party over the allocations' common denominator"),
    "capacity_num": ("count", "exact pane ns × that common denominator: allocated_fraction's denominator"),
    "busy_num": ("count", "exact Σ sm_util_cp · interval_ms of all the pane's process samples"),
    "window_start_ns": (NS, "start of the health audit window"),
    "window_end_ns": (NS, "end of the health audit window (exclusive)"),
    "energy_uj": ("microjoules", "Σ power_mw · interval_ms over the window's GPU samples"),
    "mean_power_w": ("watts", "energy_uj / covered_ms / 1000"),
    "effective_tops": ("tops", "peak TOPS scaled by how busy the SMs were"),
    "kw_per_tops": ("kw_per_tops", "mean power per effective TOPS (null: no busy time)"),
    "sched_deviation": ("fraction", "share of covered time in which the hardware disagreed with the schedule"),
    "coverage": ("fraction", "covered_ms over the window's length"),
    "grade": (None, "idle, excellent, good or needs_optimisation"),
    "entitlement": ("fraction", "the grade's entitlement multiplier (0.75 to 1.25)"),
    "passed": (None, "whether the window passed the audit"),
    "fail_reasons": (None, "the failed checks, in order: grade, sched_deviation, coverage"),
    "windows_skipped": ("count", "windows without any GPU sample since the GPU's previous record"),
    "breaker_state": (None, "probation, in_service, observation or removed, after this window"),
    "snapshot_sha256": (None, "SHA-256, lowercase hex, of the fields before it as canonical JSON"),
    "util_pct": ("percent", "the tenant's utilisation of the GPU in the pane"),
    "idle_run_ms": (MS, "length of the tenant's current idle run (0: not idle)"),
    "quota_scale": ("fraction", "the tenant's quota multiplier (up to 1.5 × the tier's base)"),
    "trigger_id": (None, "the trigger's identity (GPU, tenant key, run start): act on each once"),
    "run_start_ns": (NS, "start of the idle run"),
    "trigger_ns": (NS, "end of the pane where the idle run reached the tier's duration"),
    "deadline_ns": (NS, "run_start_ns + the tier's max_idle_s"),
    "held": (
        None,
        "whether the tenant held an allocation on the GPU in the trigger pane (reserved idle); null: written before",
    ),
    "flops": ("flops", "Σ flops_64b of the pane's blas traces (rounded once to a float)"),
    "efu": ("fraction", "effective FLOPs utilisation (null: no source)"),
    "efu_source": (None, "what efu comes from: flops or tensor_active"),
    "bw_util": ("fraction", "memory bandwidth utilisation"),
    "delta_bw": ("fraction", "1 − bw_util"),
    "bw_source": (None, "what bw_util comes from: dram_active or mem_bw_util"),
    "diagnosis": (None, "idle, compute_bound, memory_bound or latency_bound"),
    "peak_tops": ("tops", "the GPU model's peak used for efu"),
    "reason": (None, "why the input was refused (docs/definitions.md, 'Inputs and what is refused')"),
    "detail": (None, "the refusal in words"),
    "source": (None, "where the refused input came from: file:line, or topic[partition]@offset#line"),
    "raw": (None, "the refused input's text (cut to a bounded length)"),
}
