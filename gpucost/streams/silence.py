"""Silent GPUs and processes: when a transport closes their last panes. The rule is written once, here, for
both transports (the embedded run and the Kafka worker), so that they cannot drift apart.

A GPU taken off the fleet, or a process that exited, sends no end of input: without this its last panes (or its
partial MAE window) would stay open, unbilled, until an end of input that may never come. It is closed once it
is silent in both times:

- **event time**: ``idle_timeout_s`` behind the largest watermark of what it shares its input with (a Kafka
  partition, an embedded run); ``Auditor.close_silent`` closes what lies that far behind, and nothing else;
- **the transport's clock**: nothing heard of it for ``idle_timeout_s`` (``quiet``).

Event time alone would close the panes of a GPU whose events are only queued behind another's: a producer batches
each Kafka key's events, and a replay reads one file after another, so one GPU's watermark runs hours ahead of
another's while both are live. The clock only holds a close back; which panes close, and their records, come from
the auditors' states. docs/definitions.md ("Readings of the contract") exempts the rule from cross-path equality:
it depends on what shares the input.

Pure: the clock is read by the transport and its reading passed in (``now``), so the rule is tested on a clock
the test moves. The transports differ where their inputs differ, and each difference is explicit here:

- **what is judged against what**: a Kafka partition holds one auditor per key, each key one GPU or one process,
  judged against the largest event time of any key (``close_partition``); the embedded run holds one auditor for
  every GPU and process, each judged against the run's largest watermark (``RunSilence``);
- **what counts as heard**: a Kafka key is heard when one of its messages is applied (the worker notes when); the
  embedded run has no messages per GPU, so a GPU or process is heard when its largest event time moves;
- **forgetting** (``forget``): a Kafka key's auditor forgets a GPU gone for good, always; the embedded run only
  when its source is live or continuous, since a finite replay of one file after another finds a later file's
  GPUs far behind the run, and must not forget them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpucost.schemas.records import Output
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings

__all__ = ["Unit", "quiet", "close_partition", "RunSilence"]

#: a GPU (its UUID) or a process (``(node_id, pid)``): what is heard from, or not
Unit = str | tuple[str, int]


def quiet(heard_at: float, now: float, timeout_s: float) -> bool:
    """The clock's half of the rule: nothing heard since ``heard_at`` for ``timeout_s`` of the clock, ``now``."""
    return now - heard_at >= timeout_s


def close_partition(
    auditors: Mapping[str, Auditor], heard: Mapping[str, float], since: float, now: float, settings: AuditSettings
) -> tuple[list[Output], set[str]]:
    """The records of a Kafka partition's silent keys, and the keys whose state the closes changed (records out,
    or idle windows expired: their state is written again).

    Each key (``auditors``: one auditor per key) is judged as one: against the largest event time of any key of
    the partition (``Auditor.latest_ns``: a GPU's watermark, or a process's last address), and on when a message of
    it was last applied (``heard``; a key not heard from since the partition was taken counts as heard at
    ``since``). A key within ``idle_timeout_s`` of the largest has no open pane to close and is not asked."""
    watermarks = {key: w for key, a in auditors.items() if (w := a.latest_ns()) is not None}
    if not watermarks:
        return [], set()
    largest, out, changed = max(watermarks.values()), [], set()
    for key, auditor in auditors.items():
        watermark = watermarks.get(key)
        # an open pane ends after its GPU's watermark: a key within the timeout of the largest has none to close; a
        # key with none holds nothing to close but the kernels of a GPU that never sent a sample
        behind = (
            auditor.holds_unsampled_kernels() if watermark is None else watermark + settings.idle_timeout_ns < largest
        )
        if behind and quiet(heard.get(key, since), now, settings.idle_timeout_s):
            rolls, unbilled = auditor.idle_changes, auditor.counts["unbilled_kernels"]
            closed = auditor.close_silent(largest)
            if closed or auditor.idle_changes != rolls or auditor.counts["unbilled_kernels"] != unbilled:
                changed.add(key)
                out += closed
    return out, changed


@dataclass
class RunSilence:
    """The embedded run's GPUs and processes it has not heard from: ``Auditor.close_silent`` of those, against the
    run's largest watermark (or, with no GPU, the last address of any process), once their largest event time (a
    process's: its open MAE window's last address) has not moved for ``timeout_s`` of the clock. ``forget``: whether
    a GPU gone for good is forgotten (a live or continuous run), or kept (a finite replay of file after file)."""

    timeout_s: float
    forget: bool
    #: each GPU's largest event time, or each process's last address, when last looked at
    latest: dict[Unit, int] = field(default_factory=dict)
    heard: dict[Unit, float] = field(default_factory=dict)  # when it last moved, by the clock
    looked: float = float("-inf")

    def close(self, auditor: Auditor, now: float) -> list[Output]:
        """The records of the run's silent GPUs and processes, as of ``now`` on the run's clock."""
        if now - self.looked < min(1.0, self.timeout_s):  # a look costs a pass over the GPUs: once a second
            return []
        self.looked = now
        latest = auditor.heard_ns()
        for unit, ts in latest.items():
            if self.latest.get(unit) != ts:
                self.latest[unit], self.heard[unit] = ts, now
        for unit in self.latest.keys() - latest.keys():  # forgotten, or its window closed
            del self.latest[unit], self.heard[unit]
        silent = {unit for unit, at in self.heard.items() if quiet(at, now, self.timeout_s)}
        largest = auditor.largest_watermark()  # None: no GPU, only processes' addresses
        largest = auditor.latest_ns() if largest is None else largest
        if not silent or largest is None:
            return []
        return auditor.close_silent(largest, silent, self.forget)
