"""A billing consumer: total micro-dollars per team from the cost topic, each record once.

The pattern every billing system should follow:
  * read with isolation_level="read_committed" (only committed data, if producers use transactions);
  * drop any record whose ``record_id`` was already counted: the pipeline may re-deliver a
    record after a crash, always byte-identical and with the same id, never a different one;
  * keep the seen ids (and the totals) durably next to your committed offsets, in one
    transaction of your own database. This example keeps them in memory;
  * add every record, revisions included: a late event within the revision horizon publishes
    records with ``revision`` > 0 whose ``cost_micro_usd`` is the *difference* from that party's
    previous total (negative when a late binding moved its samples to another team), so the sum
    over every record is the revised bill (docs/definitions.md, "Late data become revisions").

    python examples/billing_consumer.py --bootstrap 127.0.0.1:19092 --topic gpucost.cost --idle-exit-s 10

Security (TLS, SASL) comes from the same GPUCOST_KAFKA_* environment as every gpucost client.
gpucost compresses what it produces with zstd by default: aiokafka reads it when ``cramjam`` is
installed (it comes with gpucost; elsewhere, ``pip install cramjam``).
"""
from __future__ import annotations

import argparse
import asyncio
import json
from collections import Counter
from typing import Any

from aiokafka import AIOKafkaConsumer

from gpucost.config import KAFKA_ENV_PREFIX, environment
from gpucost.kafka.settings import KafkaSettings


async def team_totals(client_options: dict[str, Any], topic: str, group: str,
                      idle_exit_s: float) -> tuple[Counter[str], int, int, Counter[str]]:
    consumer = AIOKafkaConsumer(topic, **client_options, group_id=group, auto_offset_reset="earliest",
                                enable_auto_commit=False, isolation_level="read_committed")
    await consumer.start()
    totals: Counter[str] = Counter()
    adjustments: Counter[str] = Counter()  # of the totals, what revisions added: shown, never applied twice
    seen: set[str] = set()
    duplicates = 0
    try:
        idle = 0.0
        while idle < idle_exit_s:
            batches = await consumer.getmany(timeout_ms=500)
            idle = idle + 0.5 if not batches else 0.0
            for messages in batches.values():
                for m in messages:
                    record = json.loads(m.value)
                    if record["record_id"] in seen:
                        duplicates += 1
                        continue
                    seen.add(record["record_id"])
                    totals[record["team"]] += record["cost_micro_usd"]
                    if record["revision"]:
                        adjustments[record["team"]] += record["cost_micro_usd"]
            if batches:
                await consumer.commit()
    finally:
        await consumer.stop()
    return totals, len(seen), duplicates, adjustments


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap", default=None, help="default: GPUCOST_KAFKA_BOOTSTRAP or 127.0.0.1:19092")
    p.add_argument("--topic", default="gpucost.cost")
    p.add_argument("--group", default="billing-example")
    p.add_argument("--idle-exit-s", type=float, default=10.0, help="stop after this long without a record")
    args = p.parse_args()
    kafka = KafkaSettings(**{**environment(KafkaSettings, KAFKA_ENV_PREFIX),
                             **({"bootstrap": args.bootstrap} if args.bootstrap else {})})
    totals, records, duplicates, adjustments = asyncio.run(team_totals(kafka.client_options(), args.topic, args.group,
                                                          args.idle_exit_s))
    print(json.dumps({"micro_usd_by_team": dict(sorted(totals.items())), "records": records,
                      "duplicates_dropped": duplicates,
                      "revision_adjustments_micro_usd_by_team": dict(sorted(adjustments.items()))}, indent=1))


if __name__ == "__main__":
    main()
