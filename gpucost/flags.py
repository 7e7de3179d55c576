"""The flags the commands share, each falling back to a documented environment variable: settings, output
directories, Kafka, metrics, the live sources and the simulated fleet (``gpucost.cli`` builds the commands
from these)."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import socket
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from pathlib import Path

from gpucost.config import FLAG_FIELDS
from gpucost.env_flags import add_tool_timeout, env_default, env_flag, on_off, seconds
from gpucost.kafka.settings import KafkaSettings
from gpucost.kube_flags import add_kubernetes
from gpucost.producers.accelerators.libraries import LIBRARIES
from gpucost.producers.accelerators.live import COMMANDS, SERVED
from gpucost.producers.attribution import ATTRIBUTION_SOURCES
from gpucost.producers.simulate import FleetSpec
from gpucost.schemas.events import SLAS
from gpucost.schemas.labels import LABELS_MAX, labels_text
from gpucost.slurm_flags import add_slurm
from gpucost.streams.settings import AuditSettings
from gpucost.wiring import UsageError

__all__ = [
    "add_cost_series",
    "add_fleet",
    "add_kafka",
    "add_live",
    "add_metrics",
    "add_opex",
    "add_out",
    "add_settings",
    "date_arg",
    "env_default",
    "env_flag",
]

DEFAULT_OUT = "gpucost-out"


def _library(value: str) -> Path | str | None:
    """A library's path, ``auto`` (where the linker cache has it) or ``none`` (not probed)."""
    return None if value == "none" else value if value == "auto" else Path(value)


def add_out(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--out",
        type=Path,
        default=Path(env_default("GPUCOST_OUT", DEFAULT_OUT)),
        help=f"{what} (env GPUCOST_OUT; default ./{DEFAULT_OUT})",
    )


#: the audit settings a command that reads published records may take: the cost split's weights (``whatif`` bills
#: again with them, ``export focus`` states them); the others made the panes and cannot change afterwards
WEIGHT_FIELDS = ("alpha", "beta", "gamma")


def add_settings(
    p: argparse.ArgumentParser, writes_out: bool = True, fields: Sequence[str] = FLAG_FIELDS, signs: bool = True
) -> None:
    """``--config``, the audit settings ``fields`` as flags (each also its environment variable), and, where the
    command writes records (``signs``), the audit key that signs health records."""
    p.add_argument(
        "--config",
        type=Path,
        default=os.environ.get("GPUCOST_CONFIG"),
        help="TOML file of audit settings (env GPUCOST_CONFIG)",
    )
    if writes_out:
        p.add_argument("--overwrite", action="store_true", help="replace output already in --out")
    if signs:
        env_flag(
            p,
            "--audit-key-file",
            "GPUCOST_AUDIT_KEY_FILE",
            Path,
            None,
            "sign every health record's snapshot hash with the one key in this file, '<key_id> <secret hex>' "
            "(unset: health records unsigned)",
        )
    g = p.add_argument_group("audit settings (each also env GPUCOST_<NAME>, e.g. GPUCOST_PANE_S)")
    for name in fields:
        info = AuditSettings.model_fields[name]
        g.add_argument(
            f"--{name.replace('_', '-')}",
            dest=name,
            metavar="V",
            help=f"{info.description} (default {info.default})".replace("%", "%%"),
        )


def add_opex(p: argparse.ArgumentParser) -> None:
    """The audit setting ``opex_usd_per_gpu_hour`` (the same environment variable), for the commands that only read."""
    info = AuditSettings.model_fields["opex_usd_per_gpu_hour"]
    env_flag(
        p,
        "--opex-usd-per-gpu-hour",
        "GPUCOST_OPEX_USD_PER_GPU_HOUR",
        _decimal,
        str(info.default),
        f"{info.description}, in view unit_cost",
    )


def _decimal(text: str) -> Decimal:
    """A non-negative decimal flag, exactly as written."""
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value.is_finite() or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number ≥ 0, got {text!r}")
    return value


def date_arg(text: str) -> dt.date:
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a date YYYY-MM-DD: {text!r}") from None


def add_compact(p: argparse.ArgumentParser, env: str) -> None:
    env_flag(
        p,
        "--compact-min-files",
        env,
        int,
        "64",
        "merge a partition's small files once it has gained this many (0: never)",
    )


def compact_min_files(args: argparse.Namespace) -> int:
    """``--compact-min-files``: 0 (never) or at least 2, since merging one file changes nothing."""
    if args.compact_min_files == 1 or args.compact_min_files < 0:
        raise UsageError(f"--compact-min-files must be 0 (never) or at least 2, got {args.compact_min_files}")
    return int(args.compact_min_files)


def add_report(p: argparse.ArgumentParser, default: str) -> None:
    """Whether the command leaves ``OUT/report.html`` (on by default for ``run``, which a person watches; off for
    ``replay``, a batch step: ``gpucost report`` builds the page from the output whenever it is wanted)."""
    env_flag(p, "--report", "GPUCOST_REPORT", on_off, default, "write OUT/report.html at the end: on or off")


def add_log_format(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--log-format",
        choices=["text", "json"],
        default=env_default("GPUCOST_LOG_FORMAT", "text"),
        help="off a terminal, a progress line a minute: key=value words, or one JSON object a line "
        "(env GPUCOST_LOG_FORMAT; default text)",
    )


def add_publication(p: argparse.ArgumentParser) -> None:
    """How a continuous run publishes: ``gpucost.publication``."""
    env_flag(
        p,
        "--publish-delay-s",
        "GPUCOST_PUBLISH_DELAY_S",
        seconds("GPUCOST_PUBLISH_DELAY_S"),
        "60",
        "publish the records of closed panes, with a checkpoint of the run's state, this often: the most a "
        "record waits to reach the Parquet, and the most input a kill loses",
    )
    add_compact(p, "GPUCOST_RUN_COMPACT_MIN_FILES")


def add_metrics(p: argparse.ArgumentParser) -> None:
    env_flag(
        p,
        "--metrics-address",
        "GPUCOST_METRICS_ADDRESS",
        str,
        None,
        "serve Prometheus metrics at /metrics and a health check at /healthz on HOST:PORT (unset: off)",
    )


def _series_cap(text: str) -> int:
    """A cap on a metric family's label sets: its one ``_other`` series needs room, so at least 1."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number ≥ 1, got {text!r}")
    return int(text)


def add_cost_series(p: argparse.ArgumentParser) -> None:
    env_flag(
        p,
        "--cost-series",
        "GPUCOST_COST_SERIES",
        _series_cap,
        "2000",
        "with --metrics-address: the most label sets each cost metric family keeps (cost, credit, idle cost, "
        "reclaim triggers, GPUs), its _other series included; the rest is counted in that series",
    )


def add_kafka(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Kafka (each also env GPUCOST_KAFKA_<NAME>, e.g. GPUCOST_KAFKA_BOOTSTRAP)")
    for name, info in KafkaSettings.model_fields.items():
        g.add_argument(
            f"--{name.replace('_', '-')}",
            dest=f"kafka_{name}",
            metavar="V",
            help=f"{info.description} (default {info.default})",
        )


def _attribution(text: str) -> tuple[str, ...]:
    """``--attribution``'s sources, in their precedence (a pod's binding before an environment's), or ()."""
    names = {n.strip() for n in text.split(",") if n.strip()}
    if names == {"none"}:
        return ()
    if not names or not names <= set(ATTRIBUTION_SOURCES):
        raise argparse.ArgumentTypeError(
            f"{text!r}: name 'none', or one or more of {', '.join(ATTRIBUTION_SOURCES)}, separated by commas"
        )
    return tuple(n for n in ATTRIBUTION_SOURCES if n in names)


def _label_keys(text: str) -> tuple[str, ...]:
    """``--label-keys``: label names separated by commas, each one a label can have (docs/definitions.md,
    "Labels"), at most as many as a tenant may carry."""
    keys = tuple(dict.fromkeys(k.strip() for k in text.split(",") if k.strip()))
    if len(keys) > LABELS_MAX:
        raise argparse.ArgumentTypeError(f"{len(keys)} label keys: a tenant carries at most {LABELS_MAX}")
    for key in keys:
        try:
            labels_text({key: ""})
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return keys


def add_live(p: argparse.ArgumentParser) -> None:
    """Flags of the live sources (nvml, dcgm, hami, devices, ebpf), shared by run and produce."""
    p.add_argument(
        "--url",
        help="with --source dcgm or hami, or devices with an exporter's --device-tool (amd-exporter, neuron-monitor): "
        "the exporter's /metrics URL (env GPUCOST_DCGM_URL, GPUCOST_HAMI_URL, GPUCOST_DEVICES_URL)",
    )
    p.add_argument(
        "--pod-sla",
        "--dcgm-sla",
        dest="pod_sla",
        choices=["Gold", "Silver", "Bronze"],
        default=env_default("GPUCOST_POD_SLA", os.environ.get("GPUCOST_DCGM_SLA", "Bronze")),
        help="with --source dcgm or hami: SLA of the tenants made from the exporter's pod labels "
        "(env GPUCOST_POD_SLA, formerly GPUCOST_DCGM_SLA; default Bronze)",
    )
    p.add_argument(
        "--device-tool",
        choices=sorted({*COMMANDS, *SERVED, *LIBRARIES}),
        default=os.environ.get("GPUCOST_DEVICE_TOOL"),
        metavar="NAME",
        help="with --source devices: the vendor tool run each period, by the format it prints (one of "
        f"{', '.join(sorted(COMMANDS))}), the exporter read at --url ({', '.join(sorted(SERVED))}), or the vendor's "
        f"Python library ({', '.join(sorted(LIBRARIES))}); env GPUCOST_DEVICE_TOOL; each tool run or page read at "
        "most --device-timeout-s",
    )
    add_tool_timeout(
        p,
        "--device-timeout-s",
        "seconds one sample of a live source may take (a vendor tool's run, a library or NVML read, an exporter page): "
        "past it, that period is a gap, counted",
    )
    p.add_argument(
        "--device-model",
        default=os.environ.get("GPUCOST_DEVICE_MODEL"),
        metavar="NAME",
        help="with --source devices: the platforms.toml model of devices whose tool names none (amd-smi monitor; "
        "env GPUCOST_DEVICE_MODEL)",
    )
    p.add_argument(
        "--node-id",
        default=env_default("GPUCOST_NODE_ID", socket.gethostname()),
        help="this node's id in NVML events (env GPUCOST_NODE_ID; default the host name)",
    )
    p.add_argument(
        "--period-s",
        type=float,
        default=env_default("GPUCOST_PERIOD_S", "1.0"),
        help="sampling period of a live source (env GPUCOST_PERIOD_S; default 1.0)",
    )
    p.add_argument(
        "--ebpf-sample-every",
        type=int,
        default=env_default("GPUCOST_EBPF_SAMPLE_EVERY", "16"),
        help="with --source ebpf: report 1 page fault in N (env GPUCOST_EBPF_SAMPLE_EVERY; default 16)",
    )
    env_flag(
        p,
        "--libcuda",
        "GPUCOST_LIBCUDA",
        _library,
        "none",
        "with --source ebpf: probe the kernel launches and allocations of this CUDA driver library, or of "
        "libcuda.so.1 from the linker cache with 'auto' ('none': not probed, as a uprobe on every launch can "
        "double a launch-bound program's time, and launches enter no figure)",
    )
    env_flag(
        p,
        "--libcublas",
        "GPUCOST_LIBCUBLAS",
        _library,
        "auto",
        "with --source ebpf: the cuBLAS library whose GEMM calls to probe for their FLOPs ('auto': the "
        "newest libcublas.so.N from the linker cache, if the node has one; 'none': not probed)",
    )
    p.add_argument(
        "--attribution",
        type=_attribution,
        default=env_default("GPUCOST_ATTRIBUTION", "environ"),
        help="with a live source: where each GPU process's tenant is found, ahead of its first sample: "
        "'environ' (GPUCOST_TEAM…, GIT_COMMIT, CI_PIPELINE_ID, Slurm's job variables), 'kubernetes' "
        "(its pod's labels), both as 'kubernetes,environ' (a pod's binding first), or 'none' (only "
        "bindings given) (env GPUCOST_ATTRIBUTION; default environ)",
    )
    add_kubernetes(p)
    env_flag(
        p,
        "--label-keys",
        "GPUCOST_LABEL_KEYS",
        _label_keys,
        None,
        "with --attribution (or --slurm-allocations): the labels each tenant carries, to group cost by "
        "(docs/definitions.md, 'Labels'; unset: none), "
        "separated by commas: a pod's 'namespace', 'pod', 'container', 'controller', or any pod label or "
        "annotation; any environment variable of the process (SLURM_JOB_PARTITION)",
    )
    add_slurm(p)
    p.add_argument(
        "--attribution-sla",
        choices=SLAS,
        default=env_default("GPUCOST_ATTRIBUTION_SLA", "Bronze"),
        help="the SLA of a process whose environment names none (env GPUCOST_ATTRIBUTION_SLA; default Bronze)",
    )
    p.add_argument(
        "--prices",
        type=Path,
        nargs="+",
        default=[],
        help="JSON Lines of price (and tenant_binding) events, read before a live source",
    )
    p.add_argument(
        "--duration-s",
        type=float,
        default=None,
        help="stop a live source after this long, in wall-clock seconds (default: at Ctrl-C); results are written "
        "either way",
    )


def add_fleet(p: argparse.ArgumentParser) -> None:
    # string defaults go through ``type`` too, so a bad environment value is a usage error
    d = FleetSpec()
    for flag, kind, env, default, what in [
        ("--gpus", int, "GPUCOST_SIM_GPUS", d.gpus, "GPUs in the fleet"),
        ("--hours", float, "GPUCOST_SIM_HOURS", d.hours, "hours of fleet time"),
        ("--seed", int, "GPUCOST_SIM_SEED", d.seed, "random seed"),
        ("--interval-s", float, "GPUCOST_SIM_INTERVAL_S", d.interval_s, "sampling period, seconds"),
        (
            "--late-binding-fraction",
            float,
            "GPUCOST_SIM_LATE_BINDING_FRACTION",
            d.late_binding_fraction,
            "share of jobs whose binding arrives after their first samples (revisions)",
        ),
    ]:
        p.add_argument(
            flag, type=kind, default=env_default(env, str(default)), help=f"{what} (env {env}; default {default})"
        )
