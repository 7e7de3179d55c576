"""``gpucost reclaim``: act on reclaim triggers, once each. The example consumer of the reclaim topic.

Each trigger becomes one action (a JSON object): POSTed to a webhook with the header
``Idempotency-Key: <trigger_id>``, and/or appended to a JSON Lines file. Delivery is at least
once from the topic (offsets are committed after the actions they produced), and exactly once
to the receiver: every delivered ``trigger_id`` goes to a ledger, fsynced, before its offset is
committed, and a trigger the ledger holds is never sent again (a restart between the two reads it
again). Each attempt is bounded in time and bytes, and a redirect is never followed
(``gpucost.webhook``). An answer of 408, 425, 429, 5xx or a redirect, or no complete answer, is
a failed attempt, retried with back-off up to ``max_attempts``; then the trigger is recorded as
failed: logged, written to the file as failed, counted, and passed, but not ledgered, so acting
again on the same output tries it again. Any other 4xx is a trigger the receiver refuses: logged,
written to the file as refused, counted, ledgered and passed.

How a Kubernetes operator acts on it: on each action, cordon ``node_id`` (``kubectl cordon``), and
evict the pods of ``tenant_key``'s workload on ``gpu_uuid`` once ``deadline_ns`` has passed if the
tenant is still idle (its quota records say); answer 2xx only once the action is recorded, and
use the ``Idempotency-Key`` to answer a repeat with what the first one did.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer

from gpucost.kafka.clients import start
from gpucost.kafka.settings import KafkaSettings
from gpucost.kafka.signing import Keyring
from gpucost.kafka.sink import output_record, output_refusal
from gpucost.schemas.labels import labels_read
from gpucost.schemas.partitions import device_share
from gpucost.schemas.records import DeadLetter, ReclaimRecord
from gpucost.sinks.views import view_records
from gpucost.times import iso_ns
from gpucost.webhook import WebhookSettings, post

__all__ = ["action_of", "Ledger", "Reclaimer", "RETRYABLE", "from_output", "run_kafka_reclaim"]

log = logging.getLogger("gpucost.reclaim")

#: webhook answers worth trying again (and no answer at all)
RETRYABLE = frozenset({408, 425, 429, 500, 502, 503, 504})


def action_of(record: ReclaimRecord) -> dict[str, Any]:
    """What a receiver is told: reclaim this GPU from this tenant, and why."""
    return {
        "action": "reclaim",
        "trigger_id": record.trigger_id,
        "gpu_uuid": record.gpu_uuid,
        "node_id": record.node_id,
        "gpu_model": record.gpu_model,
        "tenant_key": record.tenant_key,
        "team": record.team,
        "sla": record.sla,
        "idle_since_ns": record.run_start_ns,
        "triggered_ns": record.trigger_ns,
        "idle_run_ms": record.idle_run_ms,
        "deadline_ns": record.deadline_ns,
        "usd_per_gpu_hour": None if record.usd_per_gpu_hour is None else str(record.usd_per_gpu_hour),
        # the whole device's price: a partition's ("MI300X 1/8") is its share of it, "1" for a whole device
        "device_share": str(device_share(record.gpu_model)[1]),
        "held": record.held,  # the tenant held the GPU (an allocation) in the trigger pane: reserved idle
        # the object they were sent as; a text that is not one (a record on a topic anyone may write) as the text
        "labels": record.labels if (labels := labels_read(record.labels)) is None else labels,
    }


class Ledger:
    """The trigger ids already acted on, kept in a file (one per line, each fsynced as it is added)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.done = set(path.read_text().split())
        except FileNotFoundError:
            self.done = set()

    def add(self, trigger_id: str) -> None:
        with open(self.path, "a") as fh:
            fh.write(f"{trigger_id}\n")
            fh.flush()
            os.fsync(fh.fileno())
        self.done.add(trigger_id)


@dataclass
class Reclaimer:
    """Acts on triggers: ``webhook`` (a URL) and/or ``actions_file`` (JSON Lines); ``dry_run`` only says what it
    would do. ``counts``: ``delivered``, ``already_done``, ``refused``, ``failed``, ``retries`` (and, in a dry run,
    ``would_act``)."""

    ledger: Ledger | None
    webhook: str | None = None
    actions_file: Path | None = None
    dry_run: bool = False
    settings: WebhookSettings = field(default_factory=WebhookSettings)
    counts: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(("delivered", "already_done", "refused", "failed", "retries"), 0)
    )

    async def act(self, records: Iterable[ReclaimRecord], stop: asyncio.Event | None = None) -> None:
        """Each trigger once, in order; returns when each is delivered, refused or failed (or ``stop`` is set
        mid-way: then raises ``asyncio.CancelledError``, and the offsets of what is left must not be committed)."""
        for record in records:
            if self.ledger is not None and record.trigger_id in self.ledger.done:
                self.counts["already_done"] += 1
                continue
            action = action_of(record)
            if self.dry_run:
                self.counts["would_act"] = self.counts.get("would_act", 0) + 1
                # the times as a person reads them first, then the action exactly as a receiver would get it
                print(
                    f"would reclaim: GPU {record.gpu_uuid} from {record.tenant_key}, idle since "
                    f"{iso_ns(record.run_start_ns)}, triggered {iso_ns(record.trigger_ns)}: {json.dumps(action)}"
                )
                continue
            outcome = "delivered"
            if self.webhook is not None:
                outcome = await self._post(action, stop)
            if self.actions_file is not None:
                with open(self.actions_file, "a") as fh:
                    fh.write(json.dumps({**action, "outcome": outcome}) + "\n")
                    fh.flush()
                    os.fsync(fh.fileno())
            if self.ledger is not None and outcome != "failed":
                self.ledger.add(record.trigger_id)
            self.counts[outcome] += 1

    async def _post(self, action: dict[str, Any], stop: asyncio.Event | None) -> str:
        """``delivered``, ``refused`` or, once ``max_attempts`` have failed, ``failed``."""
        body, key, s = json.dumps(action).encode(), action["trigger_id"], self.settings
        wait, why = s.backoff_s, ""
        for attempt in range(1, s.max_attempts + 1):
            try:
                answer = await post(
                    self.webhook or "", body, {"Content-Type": "application/json", "Idempotency-Key": key}, s
                )
            except ValueError as exc:
                log.error("trigger %r cannot be sent: %s; recorded as refused", key, exc)
                return "refused"
            status, why = answer.status, answer.why
            if status is not None and 200 <= status < 300:
                return "delivered"
            if status is not None and status >= 400 and status not in RETRYABLE:
                log.error("the webhook refused trigger %s: %s; recorded as refused, not retried", key, why)
                return "refused"
            if attempt < s.max_attempts:
                self.counts["retries"] += 1
                log.warning(
                    "trigger %s not delivered (attempt %d of %d: %s); trying again in %.1f s",
                    key,
                    attempt,
                    s.max_attempts,
                    why,
                    wait,
                )
                if stop is not None and stop.is_set():
                    raise asyncio.CancelledError("stopped with a trigger undelivered")
                await asyncio.sleep(wait)
                wait = min(wait * 2, s.max_backoff_s)
        log.error(
            "trigger %s not delivered in %d attempt(s), the last: %s; recorded as failed, not ledgered",
            key,
            s.max_attempts,
            why,
        )
        return "failed"


def from_output(out_dir: Path) -> list[ReclaimRecord]:
    """The reclaim triggers under ``out_dir``, in the order they fired."""
    return view_records(out_dir, "reclaim", "ORDER BY trigger_ns, gpu_uuid, tenant_key")


async def run_kafka_reclaim(
    kafka: KafkaSettings, group: str, reclaimer: Reclaimer, stop: asyncio.Event, keyring: Keyring | None = None
) -> None:
    """Follow the reclaim topic as consumer group ``group`` until ``stop``: act on each poll's triggers, then
    commit its offsets (never with ``dry_run``). With ``keyring``, a message the workers did not sign is
    logged with its reason and counted (``unverified``), never acted on."""
    consumer = AIOKafkaConsumer(
        kafka.topic("reclaim"),
        **kafka.client_options(),
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    )
    reclaimer.counts.setdefault("unverified", 0)
    await start(consumer)
    try:
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=500)
            records = []
            for tp, messages in batches.items():
                for m in messages:
                    source = f"{tp.topic}[{tp.partition}]@{m.offset}"
                    record = output_record("reclaim", m.value or b"", source, output_refusal(keyring, m))
                    if isinstance(record, DeadLetter):
                        reclaimer.counts["unverified"] += 1
                        log.warning("%s: %s (%s); not acted on", source, record.reason, record.detail)
                        continue
                    records.append(record)
            try:
                await reclaimer.act(records, stop)  # type: ignore[arg-type]
            except asyncio.CancelledError:
                return  # stopped mid-way: what is left is read again by the next run
            if batches and not reclaimer.dry_run:
                await consumer.commit()
    finally:
        await consumer.stop()
