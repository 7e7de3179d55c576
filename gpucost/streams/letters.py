"""The dead letters the audit writes: one builder per reason, each counting it, so that the row entry and the
batch entry (``gpucost.streams.columnar``) refuse an event in the same words."""

from __future__ import annotations

from collections import Counter

from gpucost.schemas.codec import Rejected, encode_event, raw_text
from gpucost.schemas.events import EbpfTrace, Event, GpuSample, MemAccess, NumaEvent, ProcessSample
from gpucost.schemas.kernels import KernelActivity
from gpucost.schemas.records import DeadLetter
from gpucost.streams.settings import AuditSettings

__all__ = ["DeadLetters"]


def _device(event: GpuSample | ProcessSample | NumaEvent | EbpfTrace | KernelActivity) -> str:
    """The device a GPU-keyed event speaks for, as a dead letter names it."""
    return f"GPU {event.gpu_uuid}" + ("" if isinstance(event, GpuSample) else f" pid {event.pid}")


class DeadLetters:
    """What ``Auditor`` refuses with, counted under each reason in ``counts``."""

    settings: AuditSettings
    counts: Counter[str]

    def future_letter(self, event: Event, raw: str | bytes | None, source: str, now: int) -> DeadLetter:
        return self._dead(
            "future_timestamp",
            event,
            raw,
            source,
            f"ts_ns {event.ts_ns} is {(event.ts_ns - now) / 1e9:.0f} s ahead of this "
            f"worker's clock (allowed: {self.settings.max_future_s} s); fix the node's clock",
        )

    def late_letter(
        self,
        event: GpuSample | ProcessSample | NumaEvent | EbpfTrace | KernelActivity,
        raw: str | bytes | None,
        source: str,
        watermark: int | None,
    ) -> DeadLetter:
        return self._dead(
            "late",
            event,
            raw,
            source,
            f"pane of ts_ns {event.ts_ns} closed: GPU {event.gpu_uuid}'s watermark is {watermark} ns",
        )

    def duplicate_letter(
        self,
        event: GpuSample | ProcessSample | NumaEvent | EbpfTrace | KernelActivity,
        raw: str | bytes | None,
        source: str,
    ) -> DeadLetter:
        return self._dead(
            "duplicate",
            event,
            raw,
            source,
            f"a {event.kind} of {_device(event)} at ts_ns {event.ts_ns} was already "
            "counted; the first one is billed, this one is not",
        )

    def address_letter(
        self, event: MemAccess, raw: str | bytes | None, source: str, reason: str, latest_ns: int | None
    ) -> DeadLetter:
        """The dead letter of an address ``Mae.admit`` refused: ``duplicate`` or ``late`` behind ``latest_ns``,
        the latest address taken of its process."""
        what = f"a mem_access of pid {event.pid} on {event.node_id} at ts_ns {event.ts_ns}"
        if reason == "duplicate":
            return self._dead(
                reason,
                event,
                raw,
                source,
                f"{what} to address {event.address} was already counted; "
                "the first one is in its window, this one is not",
            )
        return self._dead(
            reason,
            event,
            raw,
            source,
            f"{what} is more than {self.settings.lateness_s} s (the allowed lateness) behind the latest "
            "address taken "
            f"for this process (ts_ns {latest_ns}): it cannot be told from input sent again, and is "
            "counted in no window",
        )

    def overlap_letter(self, event: GpuSample | ProcessSample, raw: str | bytes | None, source: str) -> DeadLetter:
        return self._dead(
            "overlap",
            event,
            raw,
            source,
            f"a {event.kind} of {_device(event)} lies within three quarters of its "
            f"{event.interval_ms} ms interval of one already counted in its pane: a second sampler "
            "of this device would bill its time twice; run one sampler per device",
        )

    def _dead(self, reason: str, event: Event, raw: str | bytes | None, source: str, detail: str) -> DeadLetter:
        self.counts[reason] += 1
        return DeadLetter(
            reason=reason,
            detail=detail,
            kind=event.kind,
            source=source,
            raw=encode_event(event) if raw is None else raw_text(raw),
            ts_ns=event.ts_ns,
            gpu_uuid=getattr(event, "gpu_uuid", None),
        )

    def reject(self, why: Rejected, raw: str, source: str) -> DeadLetter:
        """The dead letter of an input refused before it was decoded, counted under its reason."""
        self.counts[why.reason] += 1
        return DeadLetter(
            reason=why.reason, detail=why.detail, kind=why.kind, source=source, raw=raw, ts_ns=None, gpu_uuid=None
        )
