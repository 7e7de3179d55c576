"""How long the topics keep their records: the configuration ``topics create`` gives each one, and the
existing output topics that keep less than the setting says.

Kafka deletes a topic's records after ``retention.ms`` (its default: 7 days), whether or not anyone read
them. The output topics are what billing consumers read, so they are created with
``output_retention_days`` (400 by default: a year of bills, and a month to audit the last one), and a
topic created before (by an older gpucost, or by hand) with less is named, since Kafka would then drop
records a consumer back from a long outage still needs (docs/operations.md, "Retention, and after an
outage").
"""

from __future__ import annotations

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError

from gpucost.kafka.clients import start
from gpucost.kafka.settings import KafkaSettings
from gpucost.schemas.topics import TopicSpec, topic_specs

__all__ = ["topic_config", "short_retention", "retention_warnings"]


def topic_config(spec: TopicSpec, kafka: KafkaSettings) -> dict[str, str]:
    """The topic-level configuration a topic is created with."""
    config = {"cleanup.policy": "compact" if spec.compacted else "delete"}
    if spec.output:
        config["retention.ms"] = str(kafka.output_retention_ms())
    return config


def _shorter(have: int, want: int) -> bool:
    """Whether ``have`` ms keeps records for less time than ``want`` ms (-1: for ever)."""
    return want < 0 <= have or 0 <= have < want


async def short_retention(admin: AIOKafkaAdminClient, kafka: KafkaSettings, names: set[str]) -> dict[str, int]:
    """Of the output topics among ``names`` (topics that exist), those whose ``retention.ms`` keeps records for
    less than ``output_retention_days``, with what they keep. gpucost never alters an existing topic's
    configuration itself: an AlterConfigs request replaces every setting a topic has, an operator's included."""
    outputs = [kafka.topic(s.suffix) for s in topic_specs() if s.output and kafka.topic(s.suffix) in names]
    if not outputs:
        return {}
    responses = await admin.describe_configs(
        [ConfigResource(ConfigResourceType.TOPIC, t, {"retention.ms": None}) for t in outputs]
    )
    want, short = kafka.output_retention_ms(), {}
    for response in responses:
        for _error, _message, _kind, name, entries in response.resources:
            for entry in entries:
                if entry[0] == "retention.ms" and entry[1] is not None and _shorter(int(entry[1]), want):
                    short[name] = int(entry[1])
    return short


async def retention_warnings(kafka: KafkaSettings) -> list[str]:
    """One line per existing output topic that keeps its records for less than ``output_retention_days``, saying
    how to raise it; said by ``topics create``, since it creates only missing topics."""
    admin = AIOKafkaAdminClient(**kafka.client_options())
    await start(admin)
    try:
        short = await short_retention(admin, kafka, set(await admin.list_topics()))
    except KafkaError as exc:  # DescribeConfigs refused (an ACL), say: the topics are made, the check is not
        return [f"cannot read the output topics' retention.ms ({exc}); check it with kafka-configs.sh --describe"]
    finally:
        await admin.close()
    want = kafka.output_retention_ms()
    return [
        f"topic {name} keeps its records {have / 86_400_000:g} days (retention.ms={have}), less than "
        f"output_retention_days; a consumer offline longer misses records. Raise it: kafka-configs.sh "
        f"--bootstrap-server {kafka.bootstrap} --alter --entity-type topics --entity-name {name} "
        f"--add-config retention.ms={want}"
        for name, have in sorted(short.items())
    ]
