"""Settings of every Kafka client of gpucost (producer, worker, sink, billing example)."""
from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["KafkaSettings"]


class KafkaSettings(BaseSettings):
    """Environment variables are ``GPUCOST_KAFKA_<FIELD>`` (e.g. ``GPUCOST_KAFKA_BOOTSTRAP``)."""

    model_config = SettingsConfigDict(env_prefix="GPUCOST_KAFKA_", frozen=True, extra="forbid")

    bootstrap: Annotated[str, Field(min_length=1, description="host:port[,host:port…]")] = "127.0.0.1:19092"
    topic_prefix: Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]*$", description="prefix of every topic")] = "gpucost."
    partitions: Annotated[int, Field(ge=1, le=10_000, description="partitions of keyed topics")] = 8
    replication: Annotated[int, Field(ge=1, le=16, description="replication factor")] = 1
    batch_events: Annotated[int, Field(ge=1, le=100_000, description="events per input message")] = 500

    def topic(self, suffix: str) -> str:
        return f"{self.topic_prefix}{suffix}"

    def client_options(self) -> dict[str, Any]:
        return {"bootstrap_servers": self.bootstrap}
