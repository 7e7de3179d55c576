"""``gpucost run``: audit a fleet embedded, continuously, publishing as it goes and going on after a crash.

A run publishes every ``--publish-delay-s`` with a checkpoint of its state (``gpucost.publication``); started
again on the same ``--out`` it goes on from that checkpoint: a live source (NVML, dcgm, eBPF) from the next
event it samples, the simulated fleet from the next event after those the checkpoint counts. ``--overwrite``
starts afresh.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from gpucost.command import Command
from gpucost.cost_metrics import CostMetrics
from gpucost.embedded import Item, RunStats, run_embedded
from gpucost.flags import (
    add_cost_series,
    add_fleet,
    add_live,
    add_log_format,
    add_metrics,
    add_out,
    add_publication,
    add_report,
    add_settings,
    compact_min_files,
    env_default,
)
from gpucost.producers.live import LIVE_SOURCES, LiveSource, open_nvml
from gpucost.producers.nvml import NvmlUnavailable
from gpucost.producers.replay import read_inputs
from gpucost.producers.simulate import FleetSpec, simulate
from gpucost.progress import Progress
from gpucost.publication import Publication, resumed
from gpucost.report import gpus
from gpucost.sinks.checkpoint import CheckpointError
from gpucost.wiring import (
    Signals,
    UsageError,
    attributed,
    audit_key,
    audit_settings,
    event_files,
    fleet_spec,
    given_bindings,
    interrupt,
    live_source,
    metrics_served,
    output_dir,
    say_source_counts,
)

__all__ = ["cmd_run", "run_facts"]


def _prices_sha256(files: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def run_facts(stats: RunStats, publication: Publication) -> dict[str, int]:
    """What a progress line reports beside the inputs taken."""
    return {
        "records": sum(stats.rows.values()),
        "dead_letters": sum(stats.dead_letters.values()),
        "publications": publication.published,
    }


def _live_only(args: argparse.Namespace) -> list[str]:
    """The flags given that only a live source reads (``gpucost.wiring.attributed``, the price files)."""
    given = (
        ("--prices", args.prices),
        ("--label-keys", getattr(args, "label_keys", ())),
        ("--slurm-allocations", getattr(args, "slurm_allocations", False)),
        ("--kube-allocations", getattr(args, "kube_allocations", False)),
        ("--kube-sharing-config", getattr(args, "kube_sharing_config", None)),
    )
    return [flag for flag, value in given if value]


def cmd_run(args: argparse.Namespace) -> int:
    from gpucost.commands import finish

    settings, spec, key = audit_settings(args), fleet_spec(args), audit_key(args)  # refused before --out is made
    min_files = compact_min_files(args)
    source, nvml = args.source, None
    if source == "auto":
        try:
            nvml, source = open_nvml(args.node_id), "nvml"
        except NvmlUnavailable as exc:
            source = "simulate"
            print(
                f"gpucost: NVML is not available ({exc.reason}); running the simulated fleet: {gpus(spec.gpus)}, "
                f"{spec.hours:g} h, seed {spec.seed}",
                file=sys.stderr,
            )
    live = live_source(args, source, nvml) if source in LIVE_SOURCES else None
    prices = event_files(args.prices) if args.prices and live is not None else []
    if live is None and (unread := _live_only(args)):  # said, never dropped without a word
        print(
            f"gpucost: run: {', '.join(unread)} apply to a live source ({', '.join(LIVE_SOURCES)}) and are not "
            "read with the simulated fleet, which has its own prices and tenants; to bill events of your own, use "
            "gpucost replay",
            file=sys.stderr,
        )
    identity = (
        {"source": "simulate", "spec": dataclasses.asdict(spec)}
        if live is None
        else {"source": source, "node_id": args.node_id}
    )
    publication = Publication(
        args.out,
        args.publish_delay_s,
        settings.model_dump(mode="json"),
        identity,
        _prices_sha256(prices) if prices else None,
        min_files,
    )
    stats = RunStats(
        source=live.counts if live is not None else Counter(),
        cost=CostMetrics(args.cost_series) if args.metrics_address else None,
    )
    if live is not None:
        stats.health.watch(f"the source ({live.what})", live.silent_s)
    with (
        Signals(live, interrupt).installed(),
        output_dir(args.out, args.overwrite, "gpucost run", resumable=True),
        Progress("run", "events", facts=lambda: run_facts(stats, publication), log_format=args.log_format) as bar,
        metrics_served(args.metrics_address, stats.metrics, stats.health),
    ):
        try:
            restored = resumed(publication, settings, key, time.time_ns)
        except CheckpointError as exc:
            raise UsageError(str(exc)) from None
        auditor, read_prices, skip = None, bool(prices), 0
        if restored is not None:
            auditor, checkpoint = restored
            stats.inputs = stats.resumed_inputs = checkpoint.inputs
            skip = checkpoint.inputs if live is None else 0  # a live source samples what is new
            read_prices = bool(prices) and checkpoint.prices_sha256 != publication.prices_sha256
            print(
                f"gpucost: going on from the checkpoint in {args.out} ({checkpoint.inputs:,} inputs taken)",
                file=sys.stderr,
            )
        run_embedded(
            _items(args, live, source, spec, prices, read_prices, skip),
            settings,
            args.out,
            on_batch=lambda b: bar.update(len(b)),
            stats=stats,
            audit_key=key,
            live=live is not None,
            publication=publication,
            auditor=auditor,
        )
    say_source_counts(live)
    return finish(args.out, stats, settings.opex_usd_per_gpu_hour, args.report)


def _items(
    args: argparse.Namespace,
    live: LiveSource | None,
    source: str,
    spec: FleetSpec,
    prices: list[Path],
    read_prices: bool,
    skip: int,
) -> Iterator[Item]:
    """What the run reads: the simulated fleet past the ``skip`` events a checkpoint counts; or the ``--prices``
    file (unless a checkpoint took it as it is) and then the live source's events, attributed."""
    if live is None:
        return itertools.islice(((ev, "simulate") for ev in simulate(spec)), skip, None)
    given = given_bindings(prices) if prices else []
    return itertools.chain(
        read_inputs(prices) if read_prices else [], ((ev, source) for ev in attributed(args, live, given))
    )


# --- the command line: each command's flags and its entry in the table of gpucost.cli ---


def _run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--source",
        choices=["auto", "simulate", *LIVE_SOURCES],
        default=env_default("GPUCOST_SOURCE", "auto"),
        help="where events come from: auto = nvml where NVML works, else simulate (env GPUCOST_SOURCE)",
    )
    add_live(p)
    add_fleet(p)
    add_out(p, "output directory")
    add_settings(p)
    add_publication(p)
    add_report(p, "on")
    add_log_format(p)
    add_metrics(p)
    add_cost_series(p)


RUN = Command("run", "audit a fleet embedded (no broker): NVML if present, else simulated", _run_arguments, cmd_run)
