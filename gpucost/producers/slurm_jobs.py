"""What Slurm says of the jobs on a node, read from ``scontrol show job -d`` (its JSON, Slurm ≥ 21.08, or its text):
each job's id, tenant, times, and the GRES it holds on one node, per GPU index (docs/sources.md, "Allocations from
Slurm"). Parsing only; ``gpucost.producers.slurm_allocations`` runs the command and sends the holds.

The formats, from Slurm's source (SchedMD/slurm):

- a node's GRES detail (``gres_detail`` in the JSON, ``GRES=`` of a ``Nodes=`` line in the text), built by
  ``_foreach_job_build_details`` (src/stepmgr/gres_stepmgr.c): per GRES, ``name[:type]:count(IDX:list)``, the
  list a bitmap as ``bit_fmt`` writes it (src/common/bitstring.c: ``0-1,3``, ascending, no spaces); a shared GRES
  (``shard``, ``mps``) as ``name[:type]:count(a/b,c/d,…)``, one ``allocated/available`` per GPU of the node in its
  index order (``_build_shared_gres_details``); a GRES without bits as ``name[:type](CNT:n)``; several GRES of a
  node joined by ``,``.
- the JSON's ``gres_detail`` is one string per node of the job, in the order of its ``nodes`` hostlist expanded
  (``hostlist_nth``, the same source); the text prints a ``Nodes=<hostlist> CPU_IDs=… Mem=… GRES=…`` line per group
  of nodes with the same detail (src/scontrol/info_job.c).
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["GresHold", "Job", "gres_holds", "hostnames", "index_list", "jobs_from_json", "jobs_from_text"]

#: the GRES of a GPU, whole or shared, and the sharing mode each is billed as (docs/definitions.md)
SHARED = {"shard": "time_slicing", "mps": "mps"}
GRES_OF_GPUS = ("gpu", *SHARED)
#: the job states in which a job holds what it was allocated (a COMPLETING job has ended: its ``end_time`` is set)
HOLDING = frozenset({"RUNNING", "SUSPENDED"})
_ITEM = re.compile(r"(?P<head>[A-Za-z0-9_][^():,]*(?::[^():,]+)*)\((?P<detail>[^()]*)\)")
_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_SHARE = re.compile(r"([0-9]+)/([0-9]+)")
#: the highest GPU index a node's GRES may name, plus one: a node's GRES indices are its GPUs (MIG devices too) in
#: its gres.conf order, a few dozen on the largest nodes today (8 or 16 GPUs, up to 7 MIG devices each); 1,024
#: leaves room for any real node and refuses a bitmap that would be a list of millions (ValueError, not MemoryError)
MAX_GPU_INDICES = 1024
#: the most names a hostlist may expand to: more nodes than any Slurm cluster has; a bigger one is no node list,
#: and expanding it would exhaust memory
MAX_HOSTNAMES = 65_536


@dataclass(frozen=True)
class GresHold:
    """What a job holds of one GPU of the node, by its GRES: the GPU's index in the node's GRES order, the GRES
    (``gpu``, ``shard``, ``mps``), its type (``a100``, a MIG profile…), and the fraction held."""

    index: int
    gres: str
    type: str | None
    num: int = 1
    den: int = 1


@dataclass
class Job:
    """A job as Slurm lists it, with what it holds on this node (``gres``: its detail string, None if none here)."""

    job_id: str
    account: str
    partition: str
    user: str
    states: frozenset[str]
    start_s: int | None
    end_s: int | None
    gres: str | None = None

    @property
    def holding(self) -> bool:
        return bool(self.states & HOLDING) and "COMPLETING" not in self.states


def index_list(text: str) -> list[int]:
    """A bitmap as Slurm writes it (``0``, ``0-1``, ``0,2-3``), ascending; ValueError for anything else."""
    out: list[int] = []
    for part in text.split(","):
        m = _RANGE.fullmatch(part)
        if m is None or not part.isascii():
            raise ValueError(f"not an index list: {text!r}")
        first, last = int(m.group(1)), int(m.group(2) or m.group(1))
        if last < first or (out and first <= out[-1]):
            raise ValueError(f"not an ascending index list: {text!r}")
        if last >= MAX_GPU_INDICES:
            raise ValueError(f"GPU index {last} in {text[:100]!r}: a node has at most {MAX_GPU_INDICES} GPU indices")
        out += range(first, last + 1)
    return out


def _split_outside(text: str, brackets: str) -> Iterator[str]:
    """``text`` split at the commas outside ``brackets`` (``()``: a node's GRES; ``[]``: a hostlist's names)."""
    depth, start = 0, 0
    for i, ch in enumerate(text):
        depth += (ch == brackets[0]) - (ch == brackets[1])
        if ch == "," and depth == 0:
            yield text[start:i]
            start = i + 1
    yield text[start:]


def gres_holds(detail: str) -> tuple[list[GresHold], list[str]]:
    """The GPU holds a node's GRES detail names, and the reasons (``slurm_alloc_*`` counts) of the GPU GRES it names
    that cannot be billed. A GRES not of GPUs (``nic``, ``tmpfs``) is neither. ValueError if the detail is not Slurm's
    format at all."""
    holds: list[GresHold] = []
    unbillable: list[str] = []
    for item in _split_outside(detail.strip(), "()"):
        m = _ITEM.fullmatch(item)
        if m is None:
            raise ValueError(f"not a GRES detail: {item!r}")
        name, *rest = m.group("head").split(":")
        if rest and rest[-1].isascii() and rest[-1].isdigit():
            rest = rest[:-1]  # the count: what the detail says is what is read
        kind, body = ":".join(rest) or None, m.group("detail")
        if name not in GRES_OF_GPUS:
            continue
        if body.startswith("CNT:"):
            unbillable.append("slurm_alloc_gres_without_index")  # a count without the GPUs it is of
        elif body.startswith("IDX:"):
            if name in SHARED:  # Slurm before per-GPU counts: how much of which GPU is not said
                unbillable.append("slurm_alloc_shared_without_counts")
                continue
            holds += [GresHold(i, name, kind) for i in index_list(body[4:])]
        elif name in SHARED:
            for i, share in enumerate(body.split(",")):
                s = _SHARE.fullmatch(share)
                if s is None:
                    raise ValueError(f"not a shared GRES's counts: {item!r}")
                num, den = int(s.group(1)), int(s.group(2))
                if num > den or den == 0:
                    raise ValueError(f"more allocated than available: {item!r}")
                if num:
                    holds.append(GresHold(i, name, kind, num, den))
        else:
            raise ValueError(f"not a GPU GRES's indices: {item!r}")
    return holds, unbillable


def hostnames(hostlist: str) -> list[str]:
    """A Slurm hostlist expanded in its order (``gpu-[005-006],cn1`` → gpu-005, gpu-006, cn1): a range keeps its
    zero padding; several bracket groups in one name expand left to right, the last fastest. ValueError for one that
    is not a hostlist, or that names more than ``MAX_HOSTNAMES`` (counted before anything is expanded)."""
    names = []
    for name in _split_outside(hostlist, "[]"):
        parts = re.split(r"\[([^\]]*)\]", name)
        names.append([[(p, 0, 0)] if i % 2 == 0 else _ranges(p) for i, p in enumerate(parts)])
    total = sum(math.prod(sum(_size(r) for r in group) for group in groups) for groups in names)
    if total > MAX_HOSTNAMES:
        raise ValueError(f"the hostlist {hostlist[:100]!r} names {total:,} nodes, more than {MAX_HOSTNAMES:,}")
    out: list[str] = []
    for groups in names:
        choices = [[n for r in group for n in _expand(r)] for group in groups]
        out += ["".join(c) for c in itertools.product(*choices)]
    return out


#: a piece of a hostlist name: literal text ``(text, 0, 0)``, or a bracket's range ``("", first, last)`` whose
#: numbers are written ``width`` digits wide (``(width, first, last)`` with width an int)
_Piece = tuple[str | int, int, int]


def _ranges(ranges: str) -> list[_Piece]:
    """A bracket group's ranges, each as its width (the zero padding of its first number), first and last."""
    out: list[_Piece] = []
    for part in ranges.split(","):
        first, _, last = part.partition("-")
        if not (first.isascii() and first.isdigit() and (not last or (last.isascii() and last.isdigit()))):
            raise ValueError(f"not a hostlist range: {ranges!r}")
        out.append((len(first), int(first), int(last or first)))
    return out


def _size(piece: _Piece) -> int:
    """How many names a piece stands for: 1 for literal text, the numbers in a range."""
    width, first, last = piece
    return 1 if isinstance(width, str) else max(0, last - first + 1)


def _expand(piece: _Piece) -> list[str]:
    width, first, last = piece
    return [width] if isinstance(width, str) else [str(n).zfill(width) for n in range(first, last + 1)]


def _seconds(value: Any) -> int | None:
    """A time of Slurm's JSON: seconds, or (data_parser ≥ v0.0.39) ``{"set", "infinite", "number"}``; 0 or unset is
    None."""
    if isinstance(value, Mapping):
        value = value.get("number") if value.get("set", True) and not value.get("infinite", False) else None
    if value is None or isinstance(value, bool):
        return None
    if not isinstance(value, int):
        raise ValueError(f"not a time: {value!r}")
    return value or None


def _states(value: Any) -> frozenset[str]:
    """``job_state``: a string (data_parser ≤ v0.0.38) or a list of the state and its flags (later)."""
    states = [value] if isinstance(value, str) else value
    if not isinstance(states, list) or not all(isinstance(s, str) for s in states):
        raise ValueError(f"not a job state: {value!r}")
    return frozenset(states)


def jobs_from_json(text: str, node: str) -> list[Job]:
    """The jobs of ``scontrol show job -d --json``, each with its GRES detail on ``node``. ValueError where the
    answer is not that."""
    data = json.loads(text)
    if not isinstance(data, dict) or not isinstance(data.get("jobs"), list):
        raise ValueError("no list of jobs")
    out = []
    for j in data["jobs"]:
        if not isinstance(j, dict) or not isinstance(j.get("job_id"), int):
            raise ValueError(f"not a job: {str(j)[:200]}")
        nodes, details = j.get("nodes") or "", j.get("gres_detail") or []
        if not isinstance(nodes, str) or not isinstance(details, list):
            raise ValueError(f"job {j['job_id']}: nodes or gres_detail not as Slurm writes them")
        names = hostnames(nodes) if nodes else []
        at = names.index(node) if node in names else None
        gres = details[at] if at is not None and at < len(details) else None
        out.append(
            Job(
                job_id=str(j["job_id"]),
                account=str(j.get("account") or ""),
                partition=str(j.get("partition") or ""),
                user=str(j.get("user_name") or ""),
                states=_states(j.get("job_state", "")),
                start_s=_seconds(j.get("start_time")),
                end_s=_seconds(j.get("end_time")),
                gres=gres if isinstance(gres, str) else None,
            )
        )
    return out


_FIELD = re.compile(r"(?:^|\s)(JobId|Account|Partition|UserId|JobState|StartTime|EndTime)=(\S*)")
_NODE_LINE = re.compile(r"^\s*Nodes=(\S+) CPU_IDs=\S* Mem=\S+ GRES=(\S*)\s*$", re.MULTILINE)


def _text_time(value: str) -> int | None:
    """A time of the text form: seconds since the epoch (``SLURM_TIME_FORMAT=%s``, as this source asks), else the
    default ``2026-12-05T01:02:03`` in the local time zone; ``Unknown``, ``None`` or empty is None."""
    if value.isascii() and value.isdigit():
        return int(value) or None
    if value in ("", "Unknown", "None", "N/A"):
        return None
    return int(dt.datetime.fromisoformat(value).timestamp())


def jobs_from_text(text: str, node: str) -> list[Job]:
    """The jobs of ``scontrol show job -d`` (records parted by blank lines), each with its ``GRES=`` on ``node``.
    ValueError where a record has no ``JobId=`` or an unreadable field."""
    out = []
    for record in re.split(r"\n\s*\n", text.strip()):
        if not record.strip() or record.strip().startswith("No jobs in the system"):
            continue
        fields = {k: v for k, v in _FIELD.findall(record)}
        if not fields.get("JobId", "").isdigit():
            raise ValueError(f"a record without its JobId: {record[:200]!r}")
        gres = next((g for hosts, g in _NODE_LINE.findall(record) if node in hostnames(hosts)), None)
        out.append(
            Job(
                job_id=fields["JobId"],
                account=fields.get("Account", "").replace("(null)", ""),
                partition=fields.get("Partition", ""),
                user=fields.get("UserId", "").partition("(")[0],
                states=frozenset({fields.get("JobState", "")}),
                start_s=_text_time(fields.get("StartTime", "")),
                end_s=_text_time(fields.get("EndTime", "")),
                gres=gres,
            )
        )
    return out
