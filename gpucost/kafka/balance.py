"""Which worker of a group applies which input partition: the work, not the count, spread evenly.

Every event of a GPU goes to the partition its UUID hashes to, so partitions carry unequal work: 32 GPUs in 4
partitions gave one of two workers 58 % of the events under Kafka's round-robin assignor, which deals
partitions out by count (BENCHMARKS.md, benchmark 9). Here each member of the group reports, when it joins,
what it measured (``Report``), and the group's leader spreads the partitions by their expected work:

- **work of a partition** = (messages not yet committed + messages arriving a second × ``RATE_WINDOW_S``) ×
  seconds a message of its topic took to apply. The backlog dominates a replay or a worker catching up; the
  arrival rate, measured between one rebalance and the next, dominates a live fleet, whose backlog is a poll's
  worth. The seconds per message are pooled over every member's measurements per topic, since messages of
  different topics hold different numbers of events (433 and 159 in benchmark 9's input); a topic nobody has
  measured yet counts the mean of those measured, and with nothing measured every message counts alike.
- **spread**: the longest-processing-time-first rule. Partitions in decreasing order of work, each to the member
  with the least work so far (at most 4/3 of the best possible busiest member, before the state kept). A partition
  stays with the member that holds its state (no restore, ``gpucost.kafka.owned``) unless moving it gains more than
  ``STICKY_SHARE`` of a member's fair share, for each partition kept (``spread`` says how); with no backlog or
  arrivals measured (a first start on empty topics, an idle fleet), every partition counts as 1, so the members get
  equal counts and keep what they had where the counts allow. Then moves and swaps of single partitions out of the
  busiest member, while one gains more than ``REFINE_SHARE`` of a fair share: on benchmark 9's input the greedy rule
  alone left the busier of two members 52.2 % of the events, the refinement 50.6 %.

A report is a few hundred bytes of JSON in the member's join request. A report that cannot be read (another
version, a corrupt or hostile member) counts as no report: the assignment is then made from the others', and is
always complete. Pure: no I/O and no clock; ``gpucost.kafka.assignor`` is the glue to aiokafka.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["ASSIGNORS", "RATE_WINDOW_S", "STICKY_SHARE", "Report", "decode_report", "encode_report", "spread", "works"]

#: the worker's ``--assignor`` choices: this module's spread, or Kafka's round-robin by count
ASSIGNORS = ("balance", "roundrobin")
#: seconds of arrivals that weigh as much as the same number of messages already waiting
RATE_WINDOW_S = 300.0
#: a partition moves away from the member holding its state only to gain more than this share of a fair share
STICKY_SHARE = 0.05
#: the refinement after the greedy spread moves a partition only to gain more than this share of a fair share
REFINE_SHARE = 0.01
#: a report's size limit when read: a member's join request is not a place for megabytes
MAX_REPORT_BYTES = 1 << 20

Partition = tuple[str, int]


@dataclass(frozen=True)
class Report:
    """What one member knows when it joins: the partitions whose state it holds, each input partition's backlog
    (messages) and arrival rate (messages a second), and per topic the seconds it spent applying messages and how
    many it applied."""

    owned: frozenset[Partition] = frozenset()
    backlog: Mapping[Partition, float] = field(default_factory=dict)
    rate: Mapping[Partition, float] = field(default_factory=dict)
    cost: Mapping[str, tuple[float, int]] = field(default_factory=dict)


def encode_report(report: Report) -> bytes:
    """``report`` as the JSON carried in a member's join request."""
    return json.dumps(
        {
            "v": 1,
            "owned": sorted(report.owned),
            "backlog": sorted([t, p, n] for (t, p), n in report.backlog.items()),
            "rate": sorted([t, p, n] for (t, p), n in report.rate.items()),
            "cost": {t: [s, n] for t, (s, n) in sorted(report.cost.items())},
        },
        separators=(",", ":"),
    ).encode()


def _figure(value: object) -> float | None:
    """A finite, non-negative number, or None: a report's figures come from other processes."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int) and not -(10**18) < value < 10**18:  # float() of a 400-digit integer raises
        return None
    number = float(value)
    return number if math.isfinite(number) and 0 <= number < 1e18 else None


def _partition(topic: object, number: object) -> Partition | None:
    ok = isinstance(topic, str) and isinstance(number, int) and not isinstance(number, bool) and 0 <= number < 1 << 31
    return (topic, number) if ok else None  # type: ignore[return-value]


def decode_report(data: bytes) -> Report | None:
    """The report in ``data``, or None where it is not one this version reads. Entries that are malformed are
    left out one by one, so a member's report counts for what can be read of it."""
    if not data or len(data) > MAX_REPORT_BYTES:
        return None
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if not isinstance(raw, dict) or raw.get("v") != 1:
        return None

    def triples(key: str) -> dict[Partition, float]:
        out: dict[Partition, float] = {}
        for entry in raw.get(key) if isinstance(raw.get(key), list) else []:
            if isinstance(entry, list) and len(entry) == 3:
                tp, n = _partition(entry[0], entry[1]), _figure(entry[2])
                if tp is not None and n is not None:
                    out[tp] = n
        return out

    owned = raw.get("owned")
    cost = raw.get("cost")
    costs: dict[str, tuple[float, int]] = {}
    for topic, pair in cost.items() if isinstance(cost, dict) else ():
        if isinstance(pair, list) and len(pair) == 2:
            seconds, count = _figure(pair[0]), _figure(pair[1])
            if seconds is not None and count is not None and count == int(count):
                costs[topic] = (seconds, int(count))
    return Report(
        owned=frozenset(
            tp
            for entry in (owned if isinstance(owned, list) else [])
            if isinstance(entry, list) and len(entry) == 2 and (tp := _partition(entry[0], entry[1])) is not None
        ),
        backlog=triples("backlog"),
        rate=triples("rate"),
        cost=costs,
    )


def works(partitions: Iterable[Partition], reports: Iterable[Report]) -> tuple[dict[Partition, float], bool]:
    """Each partition's expected work in seconds (the module's rule), from every member's report: the largest
    backlog and rate any member saw (all read the same broker at nearly the same time; a member that could not
    read it reports nothing), seconds per message pooled per topic; and whether any work was known. Where none
    was, all 1 (the partitions counted)."""
    parts = sorted(set(partitions))
    backlog: dict[Partition, float] = {}
    rate: dict[Partition, float] = {}
    spent: dict[str, list[float]] = {}
    for report in reports:
        for tp, n in report.backlog.items():
            backlog[tp] = max(backlog.get(tp, 0.0), n)
        for tp, n in report.rate.items():
            rate[tp] = max(rate.get(tp, 0.0), n)
        for topic, (seconds, count) in report.cost.items():
            pooled = spent.setdefault(topic, [0.0, 0.0])
            pooled[0] += seconds
            pooled[1] += count
    per_message = {topic: s / n for topic, (s, n) in spent.items() if n > 0 and s > 0}
    fallback = sum(per_message.values()) / len(per_message) if per_message else 1.0
    work = {
        tp: (backlog.get(tp, 0.0) + rate.get(tp, 0.0) * RATE_WINDOW_S) * per_message.get(tp[0], fallback)
        for tp in parts
    }
    measured = any(work.values())
    return (work if measured else dict.fromkeys(parts, 1.0)), measured


def spread(
    work: Mapping[Partition, float],
    subscriptions: Mapping[str, Iterable[str]],
    owners: Mapping[Partition, str],
) -> dict[str, list[Partition]]:
    """Each member's partitions: every partition of ``work`` to exactly one member subscribed to its topic (a
    partition of a topic nobody subscribes to goes to nobody). Two candidates, each refined (``_refine``): the
    greedy spread, longest first to the least loaded member, a partition staying with its owner in ``owners``
    where that costs at most ``STICKY_SHARE`` of a fair share; and the owners' spread, each member first keeping
    its own partitions, longest first, while it is below a fair share, the rest spread greedily. The owners'
    spread is taken unless its busiest member has more than ``STICKY_SHARE`` of a fair share more work than the
    greedy one's: state kept wherever keeping it is nearly free. Deterministic: members and partitions are taken
    in sorted order on ties, so the same inputs give the same assignment."""
    members = sorted(subscriptions)
    topics = {m: set(subscriptions[m]) for m in members}
    fair = sum(work.values()) / len(members) if members else 0.0
    greedy = _greedy(work, topics, {m: [] for m in members}, owners, STICKY_SHARE * fair)
    kept: dict[str, list[Partition]] = {m: [] for m in members}
    for member in members:
        load = 0.0
        for tp in sorted(
            (tp for tp, m in owners.items() if m == member and tp in work), key=lambda tp: (-work[tp], tp)
        ):
            if load < fair and tp[0] in topics[member]:
                kept[member].append(tp)
                load += work[tp]
    kept = _greedy(work, topics, kept, owners, 0.0)
    most = {
        name: max(sum(work[tp] for tp in tps) for tps in out.values()) if members else 0.0
        for name, out in (("greedy", greedy), ("kept", kept))
    }
    chosen = kept if most["kept"] <= most["greedy"] + STICKY_SHARE * fair else greedy
    return {m: sorted(tps) for m, tps in chosen.items()}


def _greedy(
    work: Mapping[Partition, float],
    topics: Mapping[str, set[str]],
    out: dict[str, list[Partition]],
    owners: Mapping[Partition, str],
    slack: float,
) -> dict[str, list[Partition]]:
    """``out`` (partitions already placed) with every other partition of ``work`` placed longest first on the least
    loaded member subscribed to its topic, or on its owner where the owner has at most ``slack`` more work; then
    refined."""
    load = {m: sum(work[tp] for tp in tps) for m, tps in out.items()}
    placed = {tp for tps in out.values() for tp in tps}
    for tp in sorted(work, key=lambda tp: (-work[tp], tp)):
        able = [m for m in sorted(out) if tp[0] in topics[m]]
        if tp in placed or not able:
            continue
        chosen = min(able, key=lambda m: (load[m], len(out[m]), m))
        owner = owners.get(tp)
        if owner in able and owner != chosen and load[owner] - load[chosen] <= slack:
            chosen = owner
        load[chosen] += work[tp]
        out[chosen].append(tp)
    fair = sum(load.values()) / len(load) if load else 0.0
    _refine(work, topics, load, out, REFINE_SHARE * fair)
    return out


def _refine(
    work: Mapping[Partition, float],
    topics: Mapping[str, set[str]],
    load: dict[str, float],
    out: dict[str, list[Partition]],
    gain: float,
) -> None:
    """Improve the greedy spread in place: while moving one of the busiest member's partitions to another member,
    or swapping one for a lighter one of another member, lowers the busier of the two by more than ``gain``,
    make the best such change. Each change lowers the busiest member's work or the number of members that busy,
    and ``gain`` keeps a partition (and its state) from moving for a trifle."""
    for _ in range(4 * sum(map(len, out.values())) + 4):
        top = max(load, key=lambda m: (load[m], m))
        best: tuple[float, Partition, str, Partition | None] | None = None
        for other in sorted(load):
            if other == top:
                continue
            for x in out[top]:
                if x[0] not in topics[other]:
                    continue
                for y in [None, *(y for y in out[other] if y[0] in topics[top] and work[y] < work[x])]:
                    moved = work[x] - (0.0 if y is None else work[y])
                    after = max(load[top] - moved, load[other] + moved)
                    if load[top] - after > gain and (best is None or after < best[0]):
                        best = (after, x, other, y)
        if best is None:
            return
        _, x, other, y = best
        moved = work[x] - (0.0 if y is None else work[y])
        out[top].remove(x)
        out[other].append(x)
        if y is not None:
            out[other].remove(y)
            out[top].append(y)
        load[top] -= moved
        load[other] += moved
