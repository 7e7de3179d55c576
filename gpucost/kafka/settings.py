"""Settings of every Kafka client of gpucost (producer, worker, sink, billing example)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

__all__ = ["KafkaSettings"]


class KafkaSettings(BaseModel):
    """The CLI reads environment variables ``GPUCOST_KAFKA_<FIELD>`` (e.g. ``GPUCOST_KAFKA_BOOTSTRAP``)
    into it (``gpucost.config.environment``); building one reads nothing.

    The security settings reach every client through ``client_options``: producers,
    workers (consumer, transactional producers, state readers), the sink, the admin client
    and the billing example. Prefer the environment for passwords over command-line flags.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap: Annotated[str, Field(min_length=1, description="host:port[,host:port…]")] = "127.0.0.1:19092"
    topic_prefix: Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]*$", description="prefix of every topic")] = "gpucost."
    partitions: Annotated[int, Field(ge=1, le=10_000, description="partitions of keyed topics")] = 8
    replication: Annotated[int, Field(ge=1, le=16, description="replication factor")] = 1
    batch_events: Annotated[int, Field(ge=1, le=100_000, description="events per input message")] = 500
    max_message_bytes: Annotated[
        int,
        Field(
            ge=4096,
            le=64 << 20,
            description=(
                "largest input message a producer sends, before compression: a batch is cut to fit, an event "
                "that cannot fit is dead-lettered (oversized). Keep it under the topic's max.message.bytes "
                "(Kafka's default 1 MiB)"
            ),
        ),
    ] = 900_000
    output_retention_days: Annotated[
        int,
        Field(
            ge=-1,
            le=36_500,
            description=(
                "days the output topics (cost, idle_index, …, dlq) keep their records, set by `topics create`: "
                "a billing consumer offline for longer misses records; -1 keeps them for ever"
            ),
        ),
    ] = 400
    event_encoding: Annotated[
        Literal["json", "arrow"],
        Field(
            description="how a producer encodes its input messages: json (JSON Lines) or arrow (one Arrow IPC "
            "record batch a message, read by workers without a JSON parser; a batch under 32 events still goes as "
            "JSON Lines, faster to read at that size); workers read both"
        ),
    ] = "arrow"
    compression: Annotated[
        Literal["zstd", "lz4", "snappy", "gzip", "none"],
        Field(
            description="compression of what gpucost produces: zstd, lz4, snappy, gzip or "
            "none (consumers must support it)"
        ),
    ] = "zstd"
    security_protocol: Annotated[
        Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"],
        Field(description="PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"),
    ] = "PLAINTEXT"
    ssl_cafile: Annotated[Path | None, Field(description="CA certificate(s), PEM, to verify the brokers")] = None
    ssl_certfile: Annotated[Path | None, Field(description="client certificate, PEM (mutual TLS)")] = None
    ssl_keyfile: Annotated[Path | None, Field(description="client private key, PEM (mutual TLS)")] = None
    ssl_password: Annotated[SecretStr | None, Field(description="password of the client private key")] = None
    ssl_check_hostname: Annotated[bool, Field(description="verify the broker's host name")] = True
    sasl_mechanism: Annotated[
        Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None,
        Field(description="PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"),
    ] = None
    sasl_username: Annotated[str | None, Field(description="SASL user")] = None
    sasl_password: Annotated[SecretStr | None, Field(description="SASL password (use the environment)")] = None

    @model_validator(mode="after")
    def _consistent(self) -> KafkaSettings:
        sasl = self.security_protocol.startswith("SASL")
        if sasl and not (self.sasl_mechanism and self.sasl_username and self.sasl_password):
            raise ValueError(
                f"security_protocol {self.security_protocol} needs sasl_mechanism, sasl_username and sasl_password"
            )
        if not sasl and self.sasl_mechanism:
            raise ValueError(
                f"sasl_mechanism is set but security_protocol is {self.security_protocol}; "
                "use SASL_PLAINTEXT or SASL_SSL"
            )
        if self.output_retention_days == 0:
            raise ValueError(
                "output_retention_days 0 would delete every output record at once; give days "
                "(default 400), or -1 to keep them for ever"
            )
        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"{name} {path} is not a readable file")
        return self

    def output_retention_ms(self) -> int:
        """``retention.ms`` of the output topics: Kafka's -1 is for ever."""
        return -1 if self.output_retention_days < 0 else self.output_retention_days * 86_400_000

    def topic(self, suffix: str) -> str:
        return f"{self.topic_prefix}{suffix}"

    def producer_options(self) -> dict[str, Any]:
        """``client_options`` and the compression: zstd by default, since gzip (aiokafka compresses at
        level 9) took 16 % of a worker's CPU for a ratio only 5 % better (BENCHMARKS.md, 2)."""
        return {**self.client_options(), "compression_type": None if self.compression == "none" else self.compression}

    def client_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"bootstrap_servers": self.bootstrap, "security_protocol": self.security_protocol}
        if self.security_protocol.endswith("SSL"):
            from aiokafka.helpers import create_ssl_context

            context = create_ssl_context(
                cafile=None if self.ssl_cafile is None else str(self.ssl_cafile),
                certfile=None if self.ssl_certfile is None else str(self.ssl_certfile),
                keyfile=None if self.ssl_keyfile is None else str(self.ssl_keyfile),
                password=None if self.ssl_password is None else self.ssl_password.get_secret_value(),
            )
            context.check_hostname = self.ssl_check_hostname
            options["ssl_context"] = context
        if self.sasl_mechanism is not None:
            assert self.sasl_password is not None
            options.update(
                sasl_mechanism=self.sasl_mechanism,
                sasl_plain_username=self.sasl_username,
                sasl_plain_password=self.sasl_password.get_secret_value(),
            )
        return options
