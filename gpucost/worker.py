"""The Kafka transport: a Faust worker whose agents wrap the same ``Auditor`` as the embedded run.

One auditor per input key (a GPU, or a process for ``mem_access``), its state in a Faust
table (changelog-backed, restored on restart or rebalance) stored with the input offset it
reflects. Per message, the outputs are sent and their delivery awaited *before* the state is
written, and a message at or below the stored offset is skipped. So after a crash a message
is either fully applied (skipped on replay) or re-processed from the state before it, giving
byte-identical records with the same ``record_id``: duplicates on the output topics are
possible, loss is not, and the sink and billing consumers drop what they have already seen.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import faust

from gpucost.kafka_settings import KafkaSettings
from schemas.records import OUTPUT_KINDS
from schemas.topics import CONTROL_HEADER, END_OF_INPUT, output_key
from sinks.parquet import kind_of
from streams.audit import Auditor, Output
from streams.settings import AuditSettings

__all__ = ["KeyedAuditors", "make_app", "run_worker"]


def _headers(raw: Mapping[str, bytes] | Iterable[tuple[str, bytes]] | None) -> dict[str, bytes]:
    if raw is None:
        return {}
    return dict(raw.items()) if isinstance(raw, Mapping) else dict(raw)


class KeyedAuditors:
    """Auditors by key, cached in memory and checked against the table on every message."""

    def __init__(self, settings: AuditSettings, table: Any) -> None:
        self.settings = settings
        self.table = table
        self._cache: dict[str, tuple[int, Auditor]] = {}
        self._pending: tuple[str, int, Auditor] | None = None

    def _auditor(self, key: str, stored: dict[str, Any] | None) -> Auditor:
        if stored is None:
            return Auditor(self.settings)
        cached = self._cache.get(key)
        if cached is not None and cached[0] == stored["offset"]:
            return cached[1]
        # first sight of this key here, or another worker moved its state on: restore
        return Auditor.from_state(self.settings, stored["state"])

    def process(self, key: str, value: bytes, headers: dict[str, bytes], source: str,
                offset: int) -> tuple[list[Output], bool]:
        """Outputs of one message, and whether it was new (False: applied before a restart)."""
        stored = self.table.get(key)
        if stored is not None and stored["offset"] >= offset:
            return [], False
        auditor = self._auditor(key, stored)
        if headers.get(CONTROL_HEADER) == END_OF_INPUT:
            outs = auditor.finish()
            auditor = Auditor(self.settings)
        else:
            outs = []
            for n, line in enumerate(value.split(b"\n")):
                if line.strip():
                    outs += auditor.ingest(line, f"{source}#{n}")
        self._pending = (key, offset, auditor)
        return outs, True

    def commit(self) -> None:
        """The outputs of the last ``process`` are delivered: record the state that produced them."""
        assert self._pending is not None, "commit() without process()"
        key, offset, auditor = self._pending
        self.table[key] = {"offset": offset, "state": auditor.to_state()}
        self._cache[key] = (offset, auditor)


def make_app(kafka: KafkaSettings, audit: AuditSettings, app_id: str, data_dir: Path,
             guarantee: str = "at_least_once", store: str = "memory://", session_timeout_s: float = 30.0) -> faust.App:
    app = faust.App(
        app_id, broker=";".join(f"kafka://{h.strip()}" for h in kafka.bootstrap.split(",")),
        store=store, datadir=str(data_dir), web_enabled=False, processing_guarantee=guarantee,
        topic_partitions=kafka.partitions, topic_replication_factor=kafka.replication,
        producer_acks=-1, consumer_auto_offset_reset="earliest",
        broker_session_timeout=session_timeout_s, broker_heartbeat_interval=max(1.0, session_timeout_s / 10),
    )
    outputs = {kind: app.topic(kafka.topic(kind), key_serializer="raw", value_serializer="raw")
               for kind in OUTPUT_KINDS}

    def agent_for(suffix: str, table_name: str) -> None:
        topic = app.topic(kafka.topic(suffix), key_serializer="raw", value_serializer="raw")
        table = app.Table(table_name, default=None, partitions=kafka.partitions)
        auditors = KeyedAuditors(audit, table)

        async def audit_stream(stream: faust.StreamT) -> None:
            async for event in stream.events():
                msg = event.message
                outs, new = auditors.process(event.key.decode(), event.value or b"", _headers(event.headers),
                                             f"{msg.topic}[{msg.partition}]@{msg.offset}", msg.offset)
                if not new:
                    continue
                delivered = [await outputs[kind_of(r)].send(key=output_key(r), value=r.model_dump_json().encode())
                             for r in outs]
                for fut in delivered:
                    await fut
                auditors.commit()

        audit_stream.__name__ = f"audit_{suffix}"
        app.agent(topic, name=f"gpucost-audit-{suffix}")(audit_stream)

    agent_for("events", "gpucost-gpu-state")
    agent_for("mem_access", "gpucost-process-state")
    return app


def run_worker(app: faust.App, loglevel: str = "warn") -> None:
    from faust.worker import Worker

    Worker(app, loglevel=loglevel, quiet=True).execute_from_commandline()
