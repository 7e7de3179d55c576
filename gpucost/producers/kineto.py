"""PyTorch profiler (Kineto) Chrome traces, JSON or gzip, as kernel, range and operator events.

The file is read as a stream of events (ijson, C backend), never whole: one pass for the header figures
(``baseTimeNanoseconds``, ``deviceProperties``), one for the events. Times are the decimal text of the
trace's µs (``ts``, ``dur``), scaled to integer ns exactly; since mid-2024 ``ts`` is relative to
``baseTimeNanoseconds``. A kernel is tied to its launch by ``args.correlation`` = the ``cuda_runtime`` /
``cuda_driver`` call's, so launches are held by correlation id until the file ends. Events that cannot be read
are counted by reason, never raised.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from pathlib import Path
from typing import IO

import ijson
from pydantic import ValidationError

from gpucost.producers.compressed import open_bytes
from gpucost.producers.kernel_table import KernelTable, OperatorTable, RangeTable
from gpucost.producers.kineto_launches import Launches
from gpucost.schemas.gemm import GEMM_OPS, gemm_work
from gpucost.schemas.kernels import NAME_MAX_CHARS, AnnotationRange, KernelActivity, rejection_reason

__all__ = ["DigitGuard", "KinetoTrace", "read_kineto"]

_GPU_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
_LAUNCH_CATS = {"cuda_runtime", "cuda_driver"}
# host spans, each kind its own table: record_function ranges and PyTorch operators, both CPU time on the
# launching thread; gpu_user_annotation is GPU time (docs/definitions.md, "Kernel cost"), not read
_SPAN_TABLES = {"user_annotation": "ranges", "cpu_op": "operators"}
_REJECTED = (KeyError, TypeError, ValueError, InvalidOperation, ValidationError)  # an event's fault: counted
_NO_LAUNCHES: dict = {}


@dataclass
class KinetoTrace:
    """What one trace file gave: its kernels, ranges (``user_annotation``) and operators (``cpu_op``) as
    columns, the GPU models by device index, and the events left out by reason."""

    kernels: KernelTable = field(default_factory=KernelTable)
    ranges: RangeTable = field(default_factory=RangeTable)
    operators: OperatorTable = field(default_factory=OperatorTable)
    gpu_models: dict[int, str] = field(default_factory=dict)
    rejected: Counter = field(default_factory=Counter)


_DIGITS_BEFORE_POINT = 40  # more than any id, count or ns a trace holds (int64 has 19 digits)
_DIGITS = bytes(49 if 48 <= b <= 57 else 48 for b in range(256))  # each byte as b"1" if a digit, else b"0"


class DigitGuard:
    """A trace's bytes as ijson reads them, refusing a run of digits as long as Python's limit on an integer's
    digits (``sys.get_int_max_str_digits``, 4,300 by default): ijson's C backend does not handle the ValueError
    Python raises for such a number and the process dies (SIGSEGV). Lifting the limit instead would let one number
    of ten million digits take minutes to read (the conversion is quadratic). No trace has such a number; a name of
    that many digits is refused with it, since the bytes do not say which it is."""

    def __init__(self, f: IO[bytes]) -> None:
        self._f, self._tail, self._at = f, b"", 0
        limit = sys.get_int_max_str_digits()
        self._run = b"1" * limit if limit else None  # digits as 1s, all else as 0s (``_DIGITS``): one substring search

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        if self._run is not None and data:
            seen = self._tail + data.translate(_DIGITS)
            if (hit := seen.find(self._run)) >= 0:
                raise ValueError(
                    f"a run of {len(self._run):,} digits or more at byte {self._at - len(self._tail) + hit:,}: no "
                    "trace has a number that long, and the JSON reader cannot take one"
                )
            self._tail = seen[len(seen.rstrip(b"1")) :]  # digits that may go on in the next read
            self._at += len(data)
        return data


def _header(path: Path) -> tuple[int, dict[int, str]]:
    """``baseTimeNanoseconds`` and the GPU models by device index; a file with no ``traceEvents`` array is no
    trace (a JSON file of something else read as an empty trace had given an empty report and exit 0)."""
    base, models, dev_id, dev_name, events = 0, {}, None, None, False
    with open_bytes(path) as raw:
        f = DigitGuard(raw)
        for prefix, event, value in ijson.parse(f, use_float=False):
            if prefix == "traceEvents" and event == "start_array":
                events = True
            elif prefix == "baseTimeNanoseconds" and event == "number":
                base = _whole(value)
            elif prefix == "deviceProperties.item.id":
                dev_id = value
            elif prefix == "deviceProperties.item.name":
                dev_name = value
            elif prefix == "deviceProperties.item" and event == "end_map":
                if isinstance(dev_id, int) and isinstance(dev_name, str):
                    models[dev_id] = dev_name
                dev_id = dev_name = None
    if not events:
        raise ValueError("no traceEvents array: it is JSON, but not a PyTorch profiler (Kineto) trace")
    return base, models


def _ns(us: object) -> int:
    """µs as written (int or decimal text) → integer ns, half-even below 1 ns."""
    if isinstance(us, bool) or not isinstance(us, (int, Decimal)):
        raise ValueError("not a number")
    return int((Decimal(_bounded(us)) * 1000).to_integral_value(ROUND_HALF_EVEN))


def _whole(value: object) -> int:
    """A field read as an integer (an int, an integral decimal, digits in a string, as ``int`` takes them)."""
    return int(_bounded(value))  # type: ignore[call-overload]  # int's own refusal names what it cannot take


def _bounded(value: object) -> object:
    """``value``, unless it is a decimal of ``_DIGITS_BEFORE_POINT`` digits or more before its point, or no finite
    number: ``1e999990`` is a short text that ``int`` spends a minute turning into a million digits (and
    ``Decimal`` arithmetic on ``1e1000000`` overflows), so it is refused before either is tried."""
    if isinstance(value, Decimal) and (not value.is_finite() or value.adjusted() >= _DIGITS_BEFORE_POINT):
        raise ValueError(f"{value:.3e} is no id, count or time a trace holds")
    return value


def _category(cat: str, name: str) -> str:
    kind = _GPU_CATS[cat]
    return "communication" if kind == "kernel" and "nccl" in name.lower() else kind


def read_kineto(path: Path, node_id: str | None = None) -> KinetoTrace:
    """All kernels, ``user_annotation`` ranges and ``cpu_op`` operators of one trace; ``node_id`` defaults to
    the file's name.

    Each event is validated as it is read (the models of ``schemas.kernels``) and kept as a row of columns.
    A kernel is validated with its launch not yet known: launches may come after their kernels, and the last
    launch of a correlation id wins, so launches are tied to kernels once the file has ended (``Launches``),
    and a kernel whose launch then fails the model's bounds is taken out with the reason the model gives. A
    kernel that fails on its own fields is kept whole (a rejected event, so rare) and rejected at the end with
    its launch, as the model says. Memory: 51 bytes a kernel (75 once tied), 36 a range, 53 an operator and 32 a
    launch, every distinct name once, and the raw events of rejected kernels (docs/kernels.md, "Memory")."""
    node = node_id or path.name
    base, models = _header(path)
    out = KinetoTrace(gpu_models=models)
    launches = Launches()
    refused: list[dict] = []  # kernels that fail on their own fields: rejected once their launch is known
    fatal: Exception | None = None  # the first GPU event that raised what no event may: raised after the pass
    for ev in _events(path, out.rejected):
        cat = ev.get("cat")
        try:
            if cat in _GPU_CATS:
                if fatal is None:
                    fatal = _gpu_event(ev, node, base, out, refused)
            elif cat in _LAUNCH_CATS:
                launch = (_whole(ev["pid"]), _whole(ev["tid"]), base + _ns(ev["ts"]))
                launches.add(_whole(ev["args"]["correlation"]), *launch)
            elif cat in _SPAN_TABLES:
                start = base + _ns(ev["ts"])
                pid, tid, name = _whole(ev["pid"]), _whole(ev["tid"]), _name(ev, out.rejected)  # in the order checked
                getattr(out, _SPAN_TABLES[cat]).append(
                    AnnotationRange(
                        node_id=node,
                        pid=pid,
                        tid=tid,
                        domain="torch",
                        name=name,
                        start_ns=start,
                        end_ns=start + _ns(ev["dur"]),
                        source="kineto",
                        **_work(cat, name, ev.get("args"), out.rejected),
                    )
                )
        except _REJECTED as exc:
            out.rejected[f"{cat}: {rejection_reason(exc)}"] += 1
    if fatal is not None:
        raise fatal
    launches.tie(out.kernels, out.rejected)
    launches.note_repeats(out.rejected)
    for ev in refused:
        try:
            out.kernels.append(_kernel(ev, node, base, launches, out.rejected))
        except _REJECTED as exc:
            out.rejected[f"{ev.get('cat')}: {rejection_reason(exc)}"] += 1
    return out


def _gpu_event(ev: dict, node: str, base: int, out: KinetoTrace, refused: list[dict]) -> Exception | None:
    """One kernel, memcpy or memset as a row, its launch left to the end; an event that fails on its own
    fields is kept for the end. Returns what no event may raise, so that it is raised once the pass is over,
    as when every GPU event waited for the end of the file."""
    notes: Counter = Counter()  # counted only once the event is in: a refused one is read again at the end
    try:
        kernel = _kernel(ev, node, base, _NO_LAUNCHES, notes)
    except _REJECTED:
        refused.append(ev)
        return None
    except Exception as exc:
        return exc
    out.rejected.update(notes)
    out.kernels.append(kernel, launch=False)  # its pid and launch columns are set by ``Launches.tie``
    return None


def _events(path: Path, rejected: Counter) -> Iterator[dict]:
    with open_bytes(path) as f:
        for ev in ijson.items(DigitGuard(f), "traceEvents.item", use_float=False):
            if isinstance(ev, dict) and ev.get("ph") == "X":
                yield ev
            elif not isinstance(ev, dict):
                rejected["traceEvents: an item that is not an object"] += 1


def _name(ev: dict, rejected: Counter) -> str:
    name = ev["name"]
    if not isinstance(name, str):
        raise ValueError("name is not a string")
    if len(name) > NAME_MAX_CHARS:
        rejected["name longer than 1024 characters, truncated"] += 1
        name = name[:NAME_MAX_CHARS]
    return name


def _kernel(ev: dict, node: str, base: int, launches: dict | Launches, rejected: Counter) -> KernelActivity:
    args = ev.get("args") or {}
    device = _whole(args.get("device", ev["pid"]))
    start = base + _ns(ev["ts"])
    corr = _whole(args.get("correlation", 0))
    pid, tid, launch_ns = launches.get(corr, (0, None, None))
    name = _name(ev, rejected)
    dims = {k: tuple(_whole(v) for v in args[k]) for k in ("grid", "block") if isinstance(args.get(k), list)}
    return KernelActivity(
        node_id=node,
        pid=pid,
        gpu_uuid=f"{node}/{device}",
        device=device,
        stream=_whole(args.get("stream", ev["tid"])),
        correlation_id=corr,
        category=_category(ev["cat"], name),
        name=name,
        start_ns=start,
        end_ns=start + _ns(ev["dur"]),
        launch_tid=tid,
        launch_ns=launch_ns,
        source="kineto",
        registers_per_thread=_int_or_none(args.get("registers per thread")),
        bytes=_int_or_none(args.get("bytes")),
        **dims,
    )


def _work(cat: str, name: str, args: object, notes: Counter) -> dict:
    """A GEMM operator's FLOPs, bytes and precision from its recorded shapes (``gemm_work``), as fields; a GEMM
    operator without them is noted, since its time and money are read but its efficiency cannot be."""
    if cat != "cpu_op" or name not in GEMM_OPS:
        return {}
    dims = args.get("Input Dims") if isinstance(args, dict) else None
    work = None if dims is None else gemm_work(name, dims, args.get("Input type"))  # type: ignore[union-attr]
    if work is None:
        why = "shapes that are no product" if dims is not None else "no shapes (profile with record_shapes=True)"
        notes[f"cpu_op: {name} with {why}: no FLOPs"] += 1
        return {}
    return {"flops": work.flops, "bytes": work.bytes, "precision": work.precision}


def _int_or_none(value: object) -> int | None:
    return _whole(value) if isinstance(value, (int, Decimal)) and not isinstance(value, bool) else None
