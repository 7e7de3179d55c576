"""Who a process belongs to, found where the process runs, and published ahead of its first sample.

A live source sees pids (NVML's process lists, eBPF); a cost record needs a tenant. Without this a
node's processes are ``unattributed`` unless someone hands in a bindings file or dcgm-exporter
knows their pod. ``Attribution`` wraps a live source's events: for each real pid it has not yet
attributed (or whose process changed: a pid reused, told by the process's start time), it asks the
binding sources in precedence order and emits the first binding found just before the event, so
the binding is never late. Bindings the stream already carries (a bindings file, dcgm-exporter's
pods) outrank every discovered one: a process one of them binds is never re-bound here.

Sources, in their precedence: ``gpucost.producers.kubernetes.KubernetesPods`` (the process's pod and
its labels), then ``ProcessEnvironment`` (``/proc/<pid>/environ``: ``GPUCOST_*`` variables,
``GIT_COMMIT``, ``CI_PIPELINE_ID``, and Slurm's job variables by the rule in ``SLURM``). A source that
may know later (a pod not yet listed) answers ``LATER``, and the process is looked at again every
``recheck_ns`` until one binds it. docs/sources.md, "Attribution at the source", is the user's account.
"""

from __future__ import annotations

import pwd
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from gpucost.producers.synthetic import SYNTHETIC_PID_BASE
from gpucost.schemas.events import SLAS, Event, TenantBinding
from gpucost.schemas.labels import labels_text

__all__ = [
    "ATTRIBUTION_SOURCES",
    "AttributionSettings",
    "BindingSource",
    "LATER",
    "Later",
    "ProcessEnvironment",
    "Attribution",
    "VARIABLES",
    "first_set",
    "start_ticks",
    "tenant_binding",
    "labels_of",
    "tenant_values",
]

#: the binding sources ``--attribution`` may name, in their precedence: a pod's labels are the platform's word
#: on who runs it, set where the workload is deployed; a process's environment can be set by whoever starts it
ATTRIBUTION_SOURCES: tuple[str, ...] = ("kubernetes", "environ")

#: each binding field and the environment variables that give it, first set wins. The Slurm rule:
#: the job's account is its team, its partition its app, its job id its pipeline (a job is one run,
#: as a pipeline is); a ``GPUCOST_*`` variable, where set, wins over Slurm's
VARIABLES: Mapping[str, tuple[str, ...]] = {
    "team": ("GPUCOST_TEAM", "SLURM_JOB_ACCOUNT"),
    "env": ("GPUCOST_ENV",),
    "app": ("GPUCOST_APP", "SLURM_JOB_PARTITION"),
    "tier": ("GPUCOST_TIER",),
    "sla": ("GPUCOST_SLA",),
    "git_commit": ("GPUCOST_GIT_COMMIT", "GIT_COMMIT"),
    "ci_pipeline_id": ("GPUCOST_CI_PIPELINE_ID", "CI_PIPELINE_ID", "SLURM_JOB_ID"),
}
SLURM = frozenset(v for names in VARIABLES.values() for v in names if v.startswith("SLURM_"))


@dataclass(frozen=True)
class AttributionSettings:
    """What discovery needs (``--attribution`` and the variables' names: docs/operations.md)."""

    variables: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: dict(VARIABLES))
    sla: str = "Bronze"  # a process whose variables name no SLA, or not one of SLAS
    proc: Path = Path("/proc")
    #: how often (event time) a pid already attributed is looked at again, for a new process behind it
    recheck_ns: int = 1_000_000_000
    #: the labels a tenant carries as dimensions (``--label-keys``; docs/definitions.md, "Labels"): each source
    #: takes the keys it knows (a pod's labels, annotations and metadata; a process's environment variables)
    label_keys: tuple[str, ...] = ()


class Later:
    """A source's answer that it does not know the process yet but may later (``LATER``, its one value)."""

    def __repr__(self) -> str:
        return "LATER"


LATER = Later()


class BindingSource(Protocol):
    """One place a process's tenant can be read from; ``Attribution`` asks each in precedence order."""

    #: recorded as the binding's ``origin`` (the source may name a finer one: ``slurm``)
    origin: str
    #: what it could not read, for the run's summary (``environ_unreadable``…)
    counts: Counter[str]

    def binding(self, node_id: str, pid: int, ts_ns: int, gpu_uuid: str | None) -> TenantBinding | Later | None:
        """The process's binding from ``ts_ns`` on (``gpu_uuid``: the GPU the event is of, if it is of one),
        None if this source does not know it, ``LATER`` if it may later."""
        ...


def first_set(fields: Mapping[str, tuple[str, ...]], *tags: Mapping[str, str]) -> tuple[dict[str, str], set[str]]:
    """Each field's value from the first of its keys set (non-empty) in ``tags``, the first mapping searched
    whole before the next; and the keys that gave them."""
    found, used = {}, set()
    for name, keys in fields.items():
        hit = next(((t[k], k) for t in tags for k in keys if t.get(k)), None)
        if hit is not None:
            found[name] = hit[0]
            used.add(hit[1])
    return found, used


def labels_of(
    settings: AttributionSettings, *tags: Mapping[str, str], counts: Counter[str] | None = None
) -> dict[str, str] | None:
    """The labels named in ``settings.label_keys``, each from the first of ``tags`` that sets it (None: none set). A
    value no label can hold (too long, control characters) is left out and counted ``label_refused``: the tenant
    keeps its other labels and its binding, rather than the process going unattributed."""
    found: dict[str, str] = {}
    for key in settings.label_keys:
        value = next((t[key] for t in tags if key in t), None)
        if value is None:
            continue
        try:
            labels_text({key: value})
        except ValueError:
            if counts is not None:
                counts["label_refused"] += 1
            continue
        found[key] = value
    return found or None


def tenant_values(
    fields: Mapping[str, str], settings: AttributionSettings, labels: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A tenant's fields as a source's binding (or allocation) carries them: ``team`` from ``fields``; ``env``,
    ``app``, ``tier`` empty where absent; an SLA not one of ``SLAS`` is ``settings.sla``; ``labels`` (``labels_of``)
    as they are. One rule for both, so that a pod's usage and what it held are billed to the same tenant."""
    sla = fields.get("sla", settings.sla)
    return {
        "team": fields["team"],
        "env": fields.get("env", ""),
        "app": fields.get("app", ""),
        "tier": fields.get("tier", ""),
        "sla": sla if sla in SLAS else settings.sla,
        "git_commit": fields.get("git_commit"),
        "ci_pipeline_id": fields.get("ci_pipeline_id"),
        "labels": dict(labels) if labels else None,
    }


def tenant_binding(
    node_id: str,
    pid: int,
    ts_ns: int,
    fields: Mapping[str, str],
    settings: AttributionSettings,
    origin: str,
    counts: Counter[str],
    invalid: str,
    labels: Mapping[str, str] | None = None,
) -> TenantBinding | None:
    """The binding of ``fields`` (``tenant_values``), or None, counted as ``invalid``, for a value no tenant key can
    hold (a ':', too long, a reserved team): a source's data, never fatal."""
    try:
        return TenantBinding(
            node_id=node_id, pid=pid, ts_ns=ts_ns, origin=origin, **tenant_values(fields, settings, labels)
        )
    except ValidationError:
        counts[invalid] += 1
        return None


def start_ticks(proc: Path, pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22), which tells a
    pid reused by a new process from the old one; None if there is no such process."""
    try:
        stat = (proc / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may hold spaces or ')': split after the last one
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


class ProcessEnvironment:
    """Bindings from a process's environment (``/proc/<pid>/environ``, read once per process)."""

    origin = "environ"

    def __init__(self, settings: AttributionSettings, counts: Counter[str] | None = None) -> None:
        self.settings = settings
        self.counts: Counter[str] = Counter() if counts is None else counts

    def _environ(self, pid: int) -> dict[str, str] | None:
        try:
            raw = (self.settings.proc / str(pid) / "environ").read_bytes()
        except FileNotFoundError:
            self.counts["environ_gone"] += 1  # ended between its sample and now
            return None
        except OSError:  # not ours to read (another user's, without CAP_SYS_PTRACE), or not a file
            self.counts["environ_unreadable"] += 1
            return None
        out = {}
        for entry in raw.split(b"\0"):
            name, sep, value = entry.partition(b"=")
            if sep:
                out[name.decode(errors="replace")] = value.decode(errors="replace")
        return out

    def _user(self, pid: int) -> str | None:
        """The name of the process's owner, the team of a process whose variables name none."""
        try:
            uid = (self.settings.proc / str(pid)).stat().st_uid
            return pwd.getpwuid(uid).pw_name
        except (OSError, KeyError):
            return None

    def binding(self, node_id: str, pid: int, ts_ns: int, gpu_uuid: str | None) -> TenantBinding | None:
        environ = self._environ(pid)
        if environ is None:
            return None
        found, used = first_set(self.settings.variables, environ)
        if not found:
            self.counts["environ_untagged"] += 1  # none of the variables: left to the sources below, or unattributed
            return None
        team = found.get("team") or self._user(pid)
        if team is None:
            self.counts["environ_no_team"] += 1
            return None
        return tenant_binding(
            node_id,
            pid,
            ts_ns,
            {**found, "team": team},
            self.settings,
            "slurm" if used & SLURM else self.origin,
            self.counts,
            "environ_invalid",
            labels_of(self.settings, environ, counts=self.counts),
        )


class Attribution:
    """Bindings for the pids of a live source's events, from ``sources`` in precedence order."""

    def __init__(
        self,
        sources: Iterable[BindingSource],
        settings: AttributionSettings,
        given: Iterable[TenantBinding] = (),
        counts: Counter[str] | None = None,
    ) -> None:
        self.sources = list(sources)
        self.settings = settings
        self.counts: Counter[str] = Counter() if counts is None else counts  # a live source's, to be said with them
        #: the processes a binding in the stream (a file, dcgm-exporter) binds: never re-bound here
        self._given: set[tuple[str, int]] = {(b.node_id, b.pid) for b in given}
        #: per process: its start time when last looked at, when (event time) that was, and whether it is settled
        #: (bound, or no source may bind it later)
        self._seen: dict[tuple[str, int], tuple[int | None, int, bool]] = {}

    def bind(self, events: Iterable[Event]) -> Iterator[Event]:
        """``events``, each preceded by the binding its process was found to have, if it is the first event
        of that process (or of a new process behind its pid)."""
        for event in events:
            if isinstance(event, TenantBinding):
                self._given.add((event.node_id, event.pid))
            else:
                pid = getattr(event, "pid", None)
                if pid is not None and pid < SYNTHETIC_PID_BASE:
                    found = self._discover(
                        event.node_id,
                        pid,
                        event.ts_ns,  # type: ignore[attr-defined]
                        getattr(event, "gpu_uuid", None),
                    )
                    if found is not None:
                        yield found
            yield event

    def _discover(self, node_id: str, pid: int, ts_ns: int, gpu_uuid: str | None) -> TenantBinding | None:
        key = (node_id, pid)
        seen = self._seen.get(key)
        if key in self._given or (seen is not None and ts_ns - seen[1] < self.settings.recheck_ns):
            return None
        start = start_ticks(self.settings.proc, pid)
        same = seen is not None and seen[0] == start
        if start is None:
            self._seen[key] = (start, ts_ns, True)
            self.counts["process_gone"] += 1
            return None
        if same and seen[2]:  # type: ignore[index]
            self._seen[key] = (start, ts_ns, True)
            return None  # the same process, already attributed (or found in no source that may know it later)
        later = False
        for source in self.sources:
            found = source.binding(node_id, pid, ts_ns, gpu_uuid)
            if isinstance(found, TenantBinding):
                self._seen[key] = (start, ts_ns, True)
                self.counts[f"bound:{found.origin}"] += 1
                return found
            later |= found is LATER
        self._seen[key] = (start, ts_ns, not later)
        if not same:
            self.counts["unattributed"] += 1  # once a process, however often it is looked at again
        return None
