"""The topic contract a billing consumer relies on: the JSON Schemas say what each field is, in which unit,
and under which version; the output topics keep their records long enough to survive an outage."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from gpucost.cli import main
from gpucost.schemas.events import EVENT_MODELS
from gpucost.schemas.records import OUTPUT_KINDS
from tests.conftest import ROOT

#: a field's unit, from its name alone: the naming rule the records follow, written here apart from the table
#: the schemas are built from
SUFFIX_UNITS = {
    "_ns": "ns",
    "_ms": "ms",
    "_micro_usd": "micro_usd",
    "_pct": "percent",
    "_bytes": "bytes",
    "_72h": "ms",
    "_w": "watts",
    "_c": "celsius",
    "_bytes_s": "bytes_per_s",
    "_uj": "microjoules",
}
INTEGER_SUFFIXES = ("_ns", "_ms", "_micro_usd")


def unit_by_name(field: str) -> str | None:
    endings = sorted((s for s in SUFFIX_UNITS if field.endswith(s)), key=len, reverse=True)
    return SUFFIX_UNITS[endings[0]] if endings else None


def test_every_schema_says_its_version_and_every_field_its_meaning_and_unit(tmp_path: Path) -> None:
    assert main(["topics", "schemas", "--schemas-out", str(tmp_path)]) == 0
    files = sorted(tmp_path.glob("*.schema.json"))
    assert len(files) == len(EVENT_MODELS) + len(OUTPUT_KINDS)
    versions = set()
    for path in files:
        schema = json.loads(path.read_text())
        version = schema["x-gpucost-schema-version"]
        versions.add(version)
        assert isinstance(version, int) and version >= 1
        assert f"/v{version}/" in schema["$id"] and schema["$id"].endswith(path.name)
        assert schema["description"].strip()
        for field, prop in schema["properties"].items():
            assert len(prop.get("description", "")) >= 10, f"{path.name}: {field} is not described"
            want = unit_by_name(field)
            if field == "idle_index_72h":
                want = "fraction"  # a ratio of two 72 h sums, not a duration
            if want is not None:
                assert prop.get("x-unit") == want, f"{path.name}: {field} has unit {prop.get('x-unit')}"
            if field.endswith(INTEGER_SUFFIXES):
                assert "integer" in json.dumps(prop), f"{path.name}: {field} must be an integer"
    assert len(versions) == 1, "one wire format version for all schemas"
    cost = json.loads((tmp_path / "record.cost.schema.json").read_text())["properties"]
    assert "micro" in cost["cost_micro_usd"]["description"] and "difference" in cost["cost_micro_usd"]["description"]


def test_a_field_without_words_is_an_error_not_a_silent_gap() -> None:
    from gpucost.schemas.json_schemas import documented

    with pytest.raises(KeyError, match="no_such_field"):
        documented({"type": "object", "properties": {"no_such_field": {"type": "integer"}}}, "record", "x")


@pytest.mark.slow
@pytest.mark.kafka
def test_topics_create_keeps_output_records_400_days_and_names_an_existing_topic_that_keeps_less(
    kafka_bootstrap: str,
) -> None:
    """Kafka's default deletes records after 7 days, read or not: a billing consumer away for a week lost
    them. The output topics are made with 400 days (or what GPUCOST_KAFKA_OUTPUT_RETENTION_DAYS says, -1
    for ever); the input and compacted topics keep the broker's settings."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    prefix = f"t{uuid.uuid4().hex[:8]}."
    outputs = list(OUTPUT_KINDS)

    async def premade() -> None:  # a topic an older gpucost made, with the broker's default retention
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(f"{prefix}mae", 1, 1)])
        finally:
            await admin.close()

    async def retention(names: list[str]) -> dict[str, str]:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            found = {}
            for response in await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, n) for n in names]):
                for resource in response.resources:
                    found.update((resource[3], e[1]) for e in resource[4] if e[0] == "retention.ms")
            return found
        finally:
            await admin.close()

    asyncio.run(premade())

    def create(prefix: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gpucost.cli", "topics", "create"],
            cwd=ROOT,
            text=True,
            capture_output=True,
            timeout=120,
            env={**os.environ, "GPUCOST_KAFKA_BOOTSTRAP": kafka_bootstrap, "GPUCOST_KAFKA_TOPIC_PREFIX": prefix, **env},
        )

    made = create(prefix)
    assert made.returncode == 0, made.stderr
    days_400_ms = str(400 * 24 * 60 * 60 * 1000)
    got = asyncio.run(retention([f"{prefix}{t}" for t in [*outputs, "events"]]))
    assert {t: got[f"{prefix}{t}"] for t in outputs if t != "mae"} == {t: days_400_ms for t in outputs if t != "mae"}
    assert got[f"{prefix}events"] != days_400_ms and got[f"{prefix}mae"] != days_400_ms
    # the topic made before keeps less, and is named with the command that raises it
    assert f"topic {prefix}mae keeps its records" in made.stderr and f"retention.ms={days_400_ms}" in made.stderr
    assert made.stderr.count("gpucost: warning:") == 1 and "Traceback" not in made.stderr
    forever = f"t{uuid.uuid4().hex[:8]}."
    assert create(forever, GPUCOST_KAFKA_OUTPUT_RETENTION_DAYS="-1").returncode == 0
    assert asyncio.run(retention([f"{forever}cost"])) == {f"{forever}cost": "-1"}
    refused = create(forever, GPUCOST_KAFKA_OUTPUT_RETENTION_DAYS="0")
    assert refused.returncode == 2 and "output_retention_days" in refused.stderr and "Traceback" not in refused.stderr


def section(page: str, heading: str) -> str:
    text = (ROOT / "docs" / page).read_text()
    assert f"\n{heading}\n" in text, f"docs/{page} has no section {heading!r}"
    body = text.split(f"\n{heading}\n", 1)[1]
    level = heading.split(" ", 1)[0]
    return re.split(rf"\n{level} |\n#{{1,{len(level) - 1}}} ", body, maxsplit=1)[0]


def test_the_docs_say_the_retention_what_to_do_after_an_outage_the_stop_order_and_when_a_bill_is_final() -> None:
    retention = section("operations.md", "### Retention, and after an outage")
    assert "400 days" in retention and "GPUCOST_KAFKA_OUTPUT_RETENTION_DAYS" in retention
    assert "After an outage of a billing consumer" in retention and "lost_to_retention" in retention
    order = section("operations.md", "### Restart, failover and stop order")
    stop = order.split("**Stop order**", 1)[1]
    steps = [stop.index(w) for w in ("1. the producers", "2. the workers", "3. the sink")]
    assert steps == sorted(steps) and "caught up" in stop and "--session-timeout-s" in order
    lag = section("operations.md", "### Lag, and the end of a finite input")
    assert "gpucost_worker_group_lag_messages" in lag and "GPUCOST_LAG_INTERVAL_S" in lag
    final = section("definitions.md", "## When a bill is final")
    assert "final_through_ns" in final and "gpucost-control: closed" in final and "every partition of the cost" in final
    assert "GPUCOST_PROGRESS_S" in (ROOT / "docs" / "operations.md").read_text()
