"""What each Slurm job on this node holds of its GPUs, as ``allocation`` events (docs/definitions.md, "Allocation
basis"): the allocation basis's source on a Slurm compute node (docs/sources.md, "Allocations from Slurm").

Slurm itself is asked, every ``refresh_ns`` of event time: ``scontrol show job -d --json`` (Slurm ≥ 21.08), else
its text form ``scontrol show job -d``, parsed by ``gpucost.producers.slurm_jobs``. A GPU a running job holds on
this node (by its ``gpu``, ``shard`` or ``mps`` GRES) first listed is an allocation; one no longer listed is the same
allocation again with its end: the job's ``end_time`` where Slurm still lists the job as ended, else the poll's
time. The diff and the ledger that ends, after a restart, the holds gone meanwhile are the kubelet source's
(``gpucost.producers.allocation_ledger``).

What Slurm says and what it does not: a GRES's GPU is an index in the node's GRES order, not a device. Which device
that index is comes from ``gpus`` (``--slurm-gpus``): ``nvml``, the NVML enumeration order (PCI bus id), the order
Slurm's ``AutoDetect=nvml`` gives its GPUs (src/plugins/gres/gpu/gres_gpu.c sorts them by their NVML index);
``minor``, the order of the device files' minor numbers, the order of a ``gres.conf`` that names each GPU's
``File=/dev/nvidiaN`` without AutoDetect; or a file of ``<index> <uuid>`` lines, which alone can name a MIG device.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import subprocess
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, NamedTuple

from pydantic import ValidationError

from gpucost.producers.allocation_ledger import Holds, polled_among
from gpucost.producers.attribution import AttributionSettings, first_set, labels_of, tenant_values
from gpucost.producers.slurm_jobs import SHARED, GresHold, Job, gres_holds, jobs_from_json, jobs_from_text
from gpucost.schemas.events import Allocation, Event

__all__ = ["GPU_ORDERS", "SlurmAllocations", "SlurmHeld", "SlurmSettings", "gpu_map"]

log = logging.getLogger("gpucost.slurm")

S = 1_000_000_000
#: the orders ``--slurm-gpus`` may name instead of a file
GPU_ORDERS = ("nvml", "minor")


@dataclass(frozen=True)
class SlurmSettings:
    """Where Slurm is asked, and for which node (``--slurm-*``: docs/operations.md)."""

    node: str  # this node's name in Slurm (its slurm.conf NodeName)
    gpus: str = "nvml"  # one of GPU_ORDERS, or the path of a file of "<index> <uuid>" lines
    scontrol: str = "scontrol"
    refresh_ns: int = 30 * S
    timeout_s: float = 20.0


class SlurmHeld(NamedTuple):
    """One hold: a job's on one device."""

    job_id: str
    gpu_uuid: str


def gpu_map(gpus: str, nvml: ModuleType | None = None) -> dict[int, str]:
    """Each GPU index of Slurm's GRES on this node and its device's UUID, by ``gpus`` (``SlurmSettings.gpus``).
    ValueError (its message says what to do) where the order cannot be read."""
    if gpus not in GPU_ORDERS:
        out = {}
        for n, line in enumerate(Path(gpus).read_text().splitlines(), 1):
            words = line.partition("#")[0].split()
            if not words:
                continue
            if len(words) != 2 or not (words[0].isascii() and words[0].isdigit()) or int(words[0]) in out:
                raise ValueError(f"{gpus}:{n}: write '<index> <uuid>', each index once")
            out[int(words[0])] = words[1]
        return out
    nv: Any = nvml if nvml is not None else importlib.import_module("pynvml")  # the real library, only here
    try:
        nv.nvmlInit()
        found = []
        for i in range(nv.nvmlDeviceGetCount()):
            handle = nv.nvmlDeviceGetHandleByIndex(i)
            try:
                mig = nv.nvmlDeviceGetMigMode(handle)[0] == nv.NVML_DEVICE_MIG_ENABLE
            except nv.NVMLError:
                mig = False  # a GPU without MIG
            if mig:
                raise ValueError("a GPU has MIG enabled, and Slurm's order of MIG devices is not NVML's")
            uuid = nv.nvmlDeviceGetUUID(handle)
            key = i if gpus == "nvml" else nv.nvmlDeviceGetMinorNumber(handle)
            found.append((key, uuid.decode() if isinstance(uuid, bytes) else uuid))
    except nv.NVMLError as exc:
        raise ValueError(f"NVML cannot list the GPUs ({exc})") from None
    finally:
        with contextlib.suppress(nv.NVMLError):  # never initialised
            nv.nvmlShutdown()  # NVML counts its inits: the NVML source's own stays open
    return {n: uuid for n, (_, uuid) in enumerate(sorted(found))}


class SlurmAllocations:
    """Allocation events from Slurm, polled as a live source's events pass (``interleave``), for the node
    ``settings.node`` names; the events carry the producer's node id, and the ledger is kept under it."""

    origin: Literal["slurm"] = "slurm"

    def __init__(
        self,
        settings: SlurmSettings,
        attribution: AttributionSettings,
        counts: Counter[str] | None = None,
        ledger_dir: Path | None = None,
        gpus: Callable[[], dict[int, str]] | None = None,
    ) -> None:
        self.settings, self.attribution = settings, attribution
        #: the holds sent and not ended, their ledger (None: nothing outlives this source), and the source's counts
        self.holds: Holds[SlurmHeld] = Holds(
            "slurm-allocations", "slurm_alloc", SlurmHeld, Counter() if counts is None else counts, ledger_dir
        )
        self._gpus = gpus or (lambda: gpu_map(settings.gpus))
        self._by_index: dict[int, str] | None = None
        self._text_only = False  # the JSON form failed where the text answered: this Slurm is older than 21.08
        self._refused_jobs: set[tuple[str, str]] = set()  # (job, reason) counted once, not at every poll

    @property
    def counts(self) -> Counter[str]:
        return self.holds.counts

    def interleave(self, events: Iterable[Event]) -> Iterator[Event]:
        """``events``, with the allocations of a poll every ``refresh_ns`` of event time among them."""
        return polled_among(events, self.settings.refresh_ns, self.poll)

    def poll(self, node_id: str, ts_ns: int) -> list[Allocation]:
        """The holds first listed now, as allocations, then those no longer listed, ended. Where Slurm does not
        answer, or answers what cannot be read, or the GPUs' order is unknown: nothing, no hold ended for want of
        an answer."""
        self.holds.load(node_id)
        jobs = self._jobs()
        by_index = self._gpu_order()
        if jobs is None or by_index is None:
            return []
        held: dict[SlurmHeld, tuple[Job, GresHold]] = {}
        unsure: set[str] = set()  # jobs whose detail could not be read: what they held is kept, not ended
        for job in jobs:
            if not job.holding or not job.gres:
                continue
            try:
                holds, unbillable = gres_holds(job.gres)
            except ValueError as exc:
                self._refuse(job, "slurm_alloc_gres_invalid", f"its GRES {job.gres!r} is not Slurm's format ({exc})")
                unsure.add(job.job_id)
                continue
            for reason in unbillable:
                self._refuse(job, reason, "")
            for h in holds:
                uuid = by_index.get(h.index)
                if uuid is None:
                    self._refuse(job, "slurm_alloc_index_unmapped", f"GPU index {h.index} is not in --slurm-gpus")
                else:
                    held[SlurmHeld(job.job_id, uuid)] = (job, h)
        keys = set(held) | {k for k in self.holds.open if k.job_id in unsure}
        listed = {j.job_id for j in jobs}
        self._refused_jobs = {r for r in self._refused_jobs if r[0] in listed}
        ended = {j.job_id: j.end_s for j in jobs if not j.holding and j.end_s is not None}

        def ended_at(k: SlurmHeld) -> int | None:
            end = ended.get(k.job_id)
            return end * S if end is not None and end * S <= ts_ns else None

        return self.holds.poll(node_id, ts_ns, keys, lambda k: self._started(k, *held[k], node_id, ts_ns), ended_at)

    def _refuse(self, job: Job, reason: str, why: str) -> None:
        if (job.job_id, reason) in self._refused_jobs:
            return
        self._refused_jobs.add((job.job_id, reason))
        self.counts[reason] += 1
        if why:
            log.warning("Slurm job %s: %s; its holds on this node are not sent (docs/sources.md)", job.job_id, why)

    def _started(self, k: SlurmHeld, job: Job, h: GresHold, node_id: str, ts_ns: int) -> Allocation | None:
        """The allocation ``k`` begins, or None, counted, for one that cannot be billed."""
        if h.gres in SHARED:
            sharing, num, den = SHARED[h.gres], h.num, h.den
        else:
            sharing, num, den = ("mig" if k.gpu_uuid.startswith("MIG-") else "exclusive"), 1, 1
        # attribution's rule for a job's processes (its SLURM_JOB_* variables), so both bases name one tenant
        environ = {"SLURM_JOB_ACCOUNT": job.account, "SLURM_JOB_PARTITION": job.partition, "SLURM_JOB_ID": job.job_id}
        environ = {k: v for k, v in {**environ, "SLURM_JOB_USER": job.user}.items() if v}
        found, _ = first_set(self.attribution.variables, environ)
        found.setdefault("team", job.user)
        start = ts_ns if job.start_s is None else min(ts_ns, job.start_s * S)
        try:
            allocation = Allocation(
                node_id=node_id,
                gpu_uuid=k.gpu_uuid,
                allocation_id=f"slurm/{k.job_id}/{k.gpu_uuid}",
                ts_ns=start,
                sharing=sharing,  # type: ignore[arg-type]
                fraction_num=num,
                fraction_den=den,
                origin=self.origin,
                **tenant_values(found, self.attribution, labels_of(self.attribution, environ, counts=self.counts)),
            )
        except ValidationError:  # an account no tenant can hold (':', a reserved team), a start out of range
            self.counts["slurm_alloc_invalid"] += 1
            self.holds.refused.add(k)
            return None
        self.counts[f"slurm_alloc_{sharing}"] += 1
        return allocation

    def _gpu_order(self) -> dict[int, str] | None:
        if self._by_index is None:
            try:
                self._by_index = self._gpus()
            except (OSError, ValueError, ImportError) as exc:
                self._unavailable("slurm_gpus_unknown", f"which device each Slurm GPU index is ({exc})", "--slurm-gpus")
        return self._by_index

    def _jobs(self) -> list[Job] | None:
        """This node's jobs as Slurm lists them, or None (counted, said once) where it does not answer readably."""
        node = self.settings.node
        if not self._text_only:
            answer = self._run("--json")
            if answer is not None:
                try:
                    return jobs_from_json(answer, node)
                except ValueError as exc:  # json.JSONDecodeError too: not the JSON form, try the text
                    json_error: str = str(exc)
            else:
                json_error = "no answer"
        answer = self._run()
        if answer is None:
            self._unavailable("slurm_unavailable", "the jobs from scontrol", "that scontrol is on PATH and answers")
            return None
        try:
            jobs = jobs_from_text(answer, node)
        except ValueError as exc:
            self._unavailable("slurm_output_invalid", f"scontrol's answer ({exc})", "the Slurm version")
            return None
        if not self._text_only:
            self._text_only = True
            log.warning("scontrol's JSON form did not answer (%s); reading its text form from now on", json_error)
        return jobs

    def _run(self, *form: str) -> str | None:
        """``scontrol show job -d`` (``form``: ``--json``), its times as seconds, or None where it fails."""
        env = {**os.environ, "SLURM_TIME_FORMAT": "%s"}  # the text form's times as seconds, not in local time
        try:
            done = subprocess.run(
                [self.settings.scontrol, "show", "job", "-d", *form],
                capture_output=True,
                text=True,
                env=env,
                timeout=self.settings.timeout_s,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None

    def _unavailable(self, count: str, what: str, check: str) -> None:
        if not self.counts[count]:
            log.warning(
                "cannot read %s; allocations wait for the next poll (check %s: docs/operations.md)", what, check
            )
        self.counts[count] += 1
