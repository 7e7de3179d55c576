"""What the commands share: usage errors, the output directory, settings from flags, the live source,
signals (handled here and nowhere else), the metrics server and key files."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import shutil
import signal
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from prometheus_client.core import Metric
from pydantic import ValidationError

from gpucost.config import FLAG_FIELDS, KAFKA_ENV_PREFIX, ConfigError, environment, load_settings
from gpucost.kafka.settings import KafkaSettings
from gpucost.kafka.signing import Signer
from gpucost.local_state import state_dir
from gpucost.metrics import Health, MetricsServer
from gpucost.producers.attribution import Attribution, AttributionSettings, BindingSource, ProcessEnvironment
from gpucost.producers.kubernetes import LABELS, KubernetesPods, KubernetesSettings
from gpucost.producers.kubernetes_allocations import KubernetesAllocations, SharingSettings
from gpucost.producers.live import LiveSettings, LiveSource, SourceUnavailable, open_live
from gpucost.producers.nvml import NvmlSampler
from gpucost.producers.replay import input_files, read_inputs
from gpucost.producers.simulate import FleetSpec
from gpucost.producers.slurm_allocations import SlurmAllocations, SlurmSettings
from gpucost.schemas.codec import decode_line, explain
from gpucost.schemas.events import Event, TenantBinding
from gpucost.schemas.records import OUTPUT_KINDS
from gpucost.sinks.checkpoint import CHECKPOINT
from gpucost.sinks.lock import OutputLock
from gpucost.streams.settings import AuditSettings

__all__ = [
    "UsageError",
    "Signals",
    "output_dir",
    "audit_settings",
    "fleet_spec",
    "invoked_as",
    "event_files",
    "output_to_read",
    "live_source",
    "say_source_counts",
    "interrupt",
    "metrics_served",
    "kafka_settings",
    "load_keys",
    "stop_on_signals",
    "attributed",
    "given_bindings",
]

T = TypeVar("T")


class UsageError(Exception):
    """A problem with what the user asked for; printed as one line, exit status 2."""


@contextmanager
def output_dir(out: Path, overwrite: bool, holder: str, resumable: bool = False) -> Iterator[None]:
    """``out`` emptied of earlier output (only with ``overwrite``), this process its only writer meanwhile:
    a sink writing there is never overwritten under its feet. ``resumable``: output with a run's checkpoint
    (``gpucost.sinks.checkpoint``) is kept, for the run to go on from."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a directory; choose a directory for the output")
    with OutputLock(out, holder):
        existing = [out / k for k in OUTPUT_KINDS if (out / k).exists()]
        if resumable and not overwrite and (out / CHECKPOINT).is_file():
            yield
            return
        # a folder holding only the temporaries of a run killed in its first publication holds no output
        holding = [p for p in existing if next(p.glob("date=*/part-*.parquet"), None) is not None]
        if holding and not overwrite:
            raise UsageError(
                f"{out} already holds gpucost output ({', '.join(p.name for p in holding)}); "
                "pass --overwrite to replace it, or choose another --out"
            )
        (out / CHECKPOINT).unlink(missing_ok=True)  # first: a kill midway leaves no checkpoint of missing output
        for path in existing:
            shutil.rmtree(path)
        yield


def output_to_read(out: Path, holding: bool = False) -> None:
    """``out`` is an output directory to read (``holding``: with gpucost output in it), or a usage error."""
    if not out.is_dir():
        raise UsageError(
            f"output directory {out} {'is a file' if out.exists() else 'does not exist'}; give the "
            "--out of a gpucost run, replay or sink, or run `gpucost run` or `gpucost replay` first"
        )
    if holding and not any((out / k).is_dir() for k in OUTPUT_KINDS):  # a wrong folder: no empty result
        raise UsageError(f"{out} holds no gpucost output; give the --out of a gpucost run, replay or sink")


def audit_key(args: argparse.Namespace) -> bytes | None:
    """The secret of ``--audit-key-file`` (the key-file format of message signing), or None."""
    path = getattr(args, "audit_key_file", None)
    return None if path is None else load_keys(Signer.from_file, path).key.secret


def audit_settings(args: argparse.Namespace) -> AuditSettings:
    return load_settings(args.config, **{f: getattr(args, f, None) for f in FLAG_FIELDS})  # a command's own flags


def fleet_spec(args: argparse.Namespace) -> FleetSpec:
    try:
        return FleetSpec(
            gpus=args.gpus,
            hours=args.hours,
            seed=args.seed,
            interval_s=args.interval_s,
            late_binding_fraction=args.late_binding_fraction,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def invoked_as() -> str:
    """How the user invoked gpucost (e.g. .venv/bin/gpucost), for hints they can paste."""
    return sys.argv[0] if Path(sys.argv[0]).name == "gpucost" else "gpucost"


def event_files(paths: list[Path]) -> list[Path]:
    """The event files to read, or a usage error naming what is missing."""
    try:
        files = input_files(paths)
    except FileNotFoundError as exc:
        raise UsageError(str(exc)) from None
    if not files:
        raise UsageError(
            f"no event files (*.jsonl, *.ndjson, *.json, their .gz, *.parquet) in {', '.join(map(str, paths))}"
        )
    return files


def live_source(args: argparse.Namespace, source: str, nvml: NvmlSampler | None = None) -> LiveSource:
    """The live source of ``--source``, opened now (or one clear usage error); it says what it does."""
    settings = LiveSettings(
        node_id=args.node_id,
        period_s=args.period_s,
        duration_s=args.duration_s,
        url=args.url,
        pod_sla=args.pod_sla,
        device_tool=args.device_tool,
        device_model=args.device_model,
        device_timeout_s=args.device_timeout_s,
        ebpf_sample_every=args.ebpf_sample_every,
        libcuda=args.libcuda,
        libcublas=args.libcublas,
    )
    try:
        live = open_live(source, settings, nvml, say=lambda text: print(f"gpucost: {text}", file=sys.stderr))
    except SourceUnavailable as exc:
        raise UsageError(str(exc)) from None
    print(
        f"gpucost: {live.what}"
        + (f" for {args.duration_s:g} s" if args.duration_s is not None else "; Ctrl-C to stop and write the results"),
        file=sys.stderr,
    )
    return live


def attributed(
    args: argparse.Namespace, live: LiveSource, given: Iterable[TenantBinding] = (), before: Iterable[Event] = ()
) -> Iterator[Event]:
    """``before`` (a reference file's events), then the live source's, each GPU process's first event preceded
    by the binding found for it at the source (``--attribution``; none for a process ``given`` or ``before``
    binds), with the allocations of ``--kube-allocations`` and ``--slurm-allocations`` among them, counted with
    the source's own counters."""
    events: Iterable[Event] = itertools.chain(before, live.events())
    settings = AttributionSettings(sla=args.attribution_sla, label_keys=getattr(args, "label_keys", None) or ())
    if getattr(args, "slurm_allocations", False):  # what Slurm's jobs hold, tenants by attribution's rule
        slurm = SlurmSettings(node=args.slurm_node, gpus=args.slurm_gpus)
        events = SlurmAllocations(slurm, settings, live.counts, state_dir()).interleave(events)
    if not args.attribution:
        return iter(events)
    if "kubernetes" in args.attribution and args.kube_allocations:  # beside the bindings, from the same kubelet
        sharing = SharingSettings(replicas=args.kube_replicas, mode=args.kube_sharing, config=args.kube_sharing_config)
        allocations = KubernetesAllocations(kubernetes_settings(args), sharing, settings, live.counts, state_dir())
        events = allocations.interleave(events)
    sources: list[BindingSource] = []
    for name in args.attribution:  # in their precedence (``ATTRIBUTION_SOURCES``)
        if name == "kubernetes":
            pods = KubernetesPods(kubernetes_settings(args), settings, live.counts)
            events = pods.named(events)  # an exporter's pods named by their labels, as their allocations are
            sources.append(pods)
        else:
            sources.append(ProcessEnvironment(settings, live.counts))
    return Attribution(sources, settings, given, live.counts).bind(events)


def kubernetes_settings(args: argparse.Namespace) -> KubernetesSettings:
    """``--kube-*``: where a node's pods and the GPUs the kubelet gave them are read."""
    settings = KubernetesSettings(
        pods_url=args.kube_pods_url,
        node_name=args.kube_node,
        token_file=Path(args.kube_token_file),
        ca_file=Path(args.kube_ca_file),
        pod_resources=Path(args.kube_pod_resources),
        labels={**LABELS, **dict(args.kube_label)},
    )
    try:
        settings.url()
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    return settings


def given_bindings(files: list[Path]) -> list[TenantBinding]:
    """The bindings a ``--prices`` file gives: they outrank any found at the source (``attributed``)."""
    return [e for e in (decode_line(line) for line, _ in read_inputs(files)) if isinstance(e, TenantBinding)]


class Signals:
    """SIGINT and SIGTERM, handled here and nowhere else: the first ends a live source's input cleanly
    (what it sampled is still written or delivered); the next, or the first when nothing is live, stops
    now (``stop_now``)."""

    def __init__(self, live: LiveSource | None, stop_now: Callable[[], None]) -> None:
        self.live, self.stop_now, self.received = live, stop_now, 0

    def __call__(self, *_: object) -> None:
        self.received += 1
        if self.received == 1 and self.live is not None:
            self.live.stop()
        else:
            self.stop_now()

    @contextmanager
    def installed(self) -> Iterator[None]:
        """For a synchronous run (an event loop's: ``stop_on_signals``)."""
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        for sig in previous:
            signal.signal(sig, self)
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def say_source_counts(live: LiveSource | None) -> None:
    """What the live source could not turn into events, so that a run never hides it behind a warning."""
    counts = {} if live is None else dict(live.counts)  # one copy: a sample that ran late may still count
    if any(counts.values()):
        print(
            "gpucost: the source counted " + ", ".join(f"{k} {v:,}" for k, v in sorted(counts.items()) if v),
            file=sys.stderr,
        )


def interrupt() -> None:
    raise KeyboardInterrupt


@contextmanager
def metrics_served(address: str | None, collect: Callable[[], Iterable[Metric]], health: Health) -> Iterator[None]:
    """The metrics server of a long-running command, for as long as it runs (nothing without an address)."""
    if address is None:
        yield
        return
    try:
        server = MetricsServer(address, collect, health)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(
            f"cannot serve metrics on {address}: {exc.strerror}; choose another --metrics-address"
        ) from None
    print(
        f"gpucost: metrics at http://{address.rpartition(':')[0] or '0.0.0.0'}:{server.port}/metrics", file=sys.stderr
    )
    try:
        yield
    finally:
        server.close()


def kafka_settings(args: argparse.Namespace) -> KafkaSettings:
    flags = {n: getattr(args, f"kafka_{n}") for n in KafkaSettings.model_fields}
    try:
        return KafkaSettings(
            **{**environment(KafkaSettings, KAFKA_ENV_PREFIX), **{k: v for k, v in flags.items() if v is not None}}
        )
    except ValidationError as exc:
        raise ConfigError(f"invalid Kafka setting: {explain(exc)}") from None


def load_keys(load: Callable[[Path], T], path: Path) -> T:
    try:
        return load(path)
    except OSError as exc:
        raise ConfigError(f"cannot read the key file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(
            f"the key file {path} is not text; give a file of '<key_id> <secret hex>' lines (docs/security.md)"
        ) from None
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def stop_on_signals(live: LiveSource | None = None) -> asyncio.Event:
    """An event set by SIGINT or SIGTERM (by the second, when the first ends ``live``'s input): the async
    commands (producer, worker, sink) stop cleanly on it."""
    stop = asyncio.Event()
    signals = Signals(live, stop.set)
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, signals)
    return stop
