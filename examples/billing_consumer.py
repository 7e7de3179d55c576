"""A billing consumer: micro-dollars per team and per month from the cost topic, each record once, and
which months are final. It needs nothing but a Kafka client (aiokafka, and cramjam for zstd): no gpucost.

The pattern every billing system should follow (docs/operations.md, "Billing consumers"):
  * read with isolation_level="read_committed": only what the workers' transactions committed;
  * drop any record whose ``record_id`` was already counted: a record may be delivered again after a crash,
    always byte-identical and with the same id, never a different one;
  * keep the seen ids (and the totals) durably next to your committed offsets, in one transaction of your own
    database. This example keeps them in memory;
  * add every record, revisions included: a late event within the revision horizon publishes records with
    ``revision`` > 0 whose ``cost_micro_usd`` is the *difference* from that party's previous total, so the
    sum over every record is the revised bill (docs/definitions.md, "Late data become revisions");
  * skip control messages (header ``gpucost-control``), and use the closed markers among them: a month is
    final once every input partition's marker, read on every cost partition, says ``final_through_ns`` at or
    past the month's end (docs/definitions.md, "When a bill is final");
  * with the workers' output keys (``--verify-keys``), count only records whose ``gpucost-signature``
    verifies (docs/security.md, "The bytes a signature covers");
  * at start, compare each partition's committed offset with the first one Kafka still holds: a consumer away
    longer than the topic's retention lost records, which it must take from the Parquet instead.

    python examples/billing_consumer.py --bootstrap 127.0.0.1:19092 --topic gpucost.cost --idle-exit-s 10

The broker and its security come from the flags or the same environment as gpucost's clients
(GPUCOST_KAFKA_BOOTSTRAP, GPUCOST_KAFKA_SECURITY_PROTOCOL, GPUCOST_KAFKA_SSL_CAFILE,
GPUCOST_KAFKA_SASL_MECHANISM, GPUCOST_KAFKA_SASL_USERNAME, GPUCOST_KAFKA_SASL_PASSWORD).
"""

from __future__ import annotations

import argparse
import asyncio
import calendar
import datetime as dt
import hashlib
import hmac
import json
import os
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

CONTROL = "gpucost-control"


def signature_ok(secrets: dict[str, bytes], key: bytes | None, value: bytes | None, headers: dict[str, bytes]) -> bool:
    """docs/security.md's steps: key, value, control and sequence headers, each after its 4-byte big-endian
    length; HMAC-SHA256 with the secret of ``gpucost-key-id``; lowercase hex in ``gpucost-signature``."""
    secret = secrets.get(headers.get("gpucost-key-id", b"").decode("utf-8", "replace"))
    if secret is None or "gpucost-signature" not in headers:
        return False
    parts = [key or b"", value or b"", headers.get(CONTROL, b""), headers.get("gpucost-seq", b"")]
    mac = hmac.new(secret, b"".join(len(p).to_bytes(4, "big") + p for p in parts), hashlib.sha256)
    return hmac.compare_digest(mac.hexdigest().encode(), headers["gpucost-signature"])


def month_end_ns(month: str) -> int:
    """The first instant after a ``YYYY-MM`` month, UTC, in ns."""
    year, m = map(int, month.split("-"))
    days = calendar.monthrange(year, m)[1]
    return int(dt.datetime(year, m, days, tzinfo=dt.UTC).timestamp() + 86_400) * 1_000_000_000


@dataclass
class Bill:
    totals: Counter[str] = field(default_factory=Counter)  # µ$ per team
    months: Counter[str] = field(default_factory=Counter)  # µ$ per month of pane start, UTC
    adjustments: Counter[str] = field(default_factory=Counter)  # of the totals, what revisions added
    seen: set[str] = field(default_factory=set)
    duplicates: int = 0
    unverified: int = 0
    #: (cost partition, input partition's key) → the largest final_through_ns its markers said there
    closed: dict[tuple[int, str], int] = field(default_factory=dict)
    partitions: set[int] = field(default_factory=set)
    lost: dict[int, tuple[int, int]] = field(default_factory=dict)  # partition → (committed, first held)

    def final_through_ns(self) -> int | None:
        """The time up to which every pane is final: the smallest, over every input partition that spoke, of
        what its markers said on every cost partition (None: not yet known everywhere)."""
        inputs = {i for _, i in self.closed}
        if not inputs or not self.partitions:
            return None
        return min((self.closed.get((c, i), -1) for c in self.partitions for i in inputs), default=None)

    def report(self) -> dict[str, Any]:
        final = self.final_through_ns()
        return {
            "micro_usd_by_team": dict(sorted(self.totals.items())),
            "records": len(self.seen),
            "duplicates_dropped": self.duplicates,
            "unverified_dropped": self.unverified,
            "revision_adjustments_micro_usd_by_team": dict(sorted(self.adjustments.items())),
            "final_through_ns": final if final is not None and final >= 0 else None,
            "months": {
                m: {"micro_usd": v, "final": final is not None and final >= month_end_ns(m)}
                for m, v in sorted(self.months.items())
            },
            "lost_to_retention": {str(p): {"committed": c, "first_held": f} for p, (c, f) in self.lost.items()},
        }

    def take(
        self,
        partition: int,
        key: bytes | None,
        value: bytes,
        headers: dict[str, bytes],
        secrets: dict[str, bytes] | None,
    ) -> None:
        if secrets is not None and not signature_ok(secrets, key, value, headers):
            self.unverified += 1
            return
        if CONTROL in headers:
            if headers[CONTROL] == b"closed":
                marker = json.loads(value)
                at = (partition, f"{marker['input_topic']}/{marker['input_partition']}")
                self.closed[at] = max(self.closed.get(at, -1), marker["final_through_ns"])
            return
        record = json.loads(value)
        if record["record_id"] in self.seen:
            self.duplicates += 1
            return
        self.seen.add(record["record_id"])
        self.totals[record["team"]] += record["cost_micro_usd"]
        start = dt.datetime.fromtimestamp(record["pane_start_ns"] // 1_000_000_000, dt.UTC)
        self.months[start.strftime("%Y-%m")] += record["cost_micro_usd"]
        if record["revision"]:
            self.adjustments[record["team"]] += record["cost_micro_usd"]


async def consume(
    client_options: dict[str, Any], topic: str, group: str, idle_exit_s: float, secrets: dict[str, bytes] | None = None
) -> Bill:
    consumer = AIOKafkaConsumer(
        topic,
        **client_options,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    await consumer.start()
    bill = Bill()
    try:
        bill.partitions = set(consumer.partitions_for_topic(topic) or ())
        idle, checked = 0.0, set()
        while idle < idle_exit_s:
            batches = await consumer.getmany(timeout_ms=500)
            if fresh := [tp for tp in consumer.assignment() if tp not in checked]:
                await lost_to_retention(consumer, fresh, bill)
                checked.update(fresh)
            bill.partitions |= set(consumer.partitions_for_topic(topic) or ())
            idle = idle + 0.5 if not batches else 0.0
            for tp, messages in batches.items():
                for m in messages:
                    bill.take(tp.partition, m.key, m.value or b"", {n: v or b"" for n, v in m.headers or ()}, secrets)
            if batches:
                await consumer.commit()
    finally:
        await consumer.stop()
    return bill


async def lost_to_retention(consumer: AIOKafkaConsumer, partitions: list[TopicPartition], bill: Bill) -> None:
    """Partitions whose committed offset Kafka no longer holds: records this group never read were deleted."""
    first = await consumer.beginning_offsets(partitions)
    for tp in partitions:
        committed = await consumer.committed(tp)
        if committed is not None and committed < first[tp]:
            bill.lost[tp.partition] = (committed, first[tp])
            print(
                f"billing: {tp.topic}[{tp.partition}]: offsets {committed}..{first[tp] - 1} were deleted by "
                "retention before this consumer read them; take that period from the Parquet (gpucost query)",
                file=sys.stderr,
            )


async def team_totals(
    client_options: dict[str, Any], topic: str, group: str, idle_exit_s: float
) -> tuple[Counter[str], int, int, Counter[str]]:
    """Totals per team, records counted, duplicates dropped and revision adjustments per team."""
    bill = await consume(client_options, topic, group, idle_exit_s)
    return bill.totals, len(bill.seen), bill.duplicates, bill.adjustments


def client_options(bootstrap: str | None) -> dict[str, Any]:
    env = os.environ.get
    options: dict[str, Any] = {
        "bootstrap_servers": bootstrap or env("GPUCOST_KAFKA_BOOTSTRAP", "127.0.0.1:19092"),
        "security_protocol": env("GPUCOST_KAFKA_SECURITY_PROTOCOL", "PLAINTEXT"),
    }
    if options["security_protocol"].endswith("SSL"):
        from aiokafka.helpers import create_ssl_context

        options["ssl_context"] = create_ssl_context(cafile=env("GPUCOST_KAFKA_SSL_CAFILE"))
    if env("GPUCOST_KAFKA_SASL_MECHANISM"):
        options.update(
            sasl_mechanism=env("GPUCOST_KAFKA_SASL_MECHANISM"),
            sasl_plain_username=env("GPUCOST_KAFKA_SASL_USERNAME"),
            sasl_plain_password=env("GPUCOST_KAFKA_SASL_PASSWORD"),
        )
    return options


def read_secrets(path: Path) -> dict[str, bytes]:
    """A key file: ``<key_id> <secret hex> [nodes]`` per line, ``#`` comments."""
    secrets = {}
    for line in path.read_text().splitlines():
        parts = line.split("#", 1)[0].split()
        if parts:
            secrets[parts[0]] = bytes.fromhex(parts[1])
    return secrets


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))  # the first paragraph
    p.add_argument("--bootstrap", default=None, help="default: GPUCOST_KAFKA_BOOTSTRAP or 127.0.0.1:19092")
    p.add_argument("--topic", default="gpucost.cost")
    p.add_argument("--group", default="billing-example")
    p.add_argument("--idle-exit-s", type=float, default=10.0, help="stop after this long without a record")
    p.add_argument(
        "--verify-keys", type=Path, default=None, help="the workers' output keys: count only records signed by one"
    )
    args = p.parse_args()
    try:
        secrets = None if args.verify_keys is None else read_secrets(args.verify_keys)
    except (OSError, ValueError, IndexError) as exc:
        print(f"billing: error: cannot read the key file {args.verify_keys}: {exc}", file=sys.stderr)
        return 2
    bill = asyncio.run(consume(client_options(args.bootstrap), args.topic, args.group, args.idle_exit_s, secrets))
    print(json.dumps(bill.report(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
