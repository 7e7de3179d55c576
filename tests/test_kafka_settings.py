"""Kafka settings: what every producer of gpucost compresses with, and that this install can."""

from __future__ import annotations

import argparse

import pytest
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from pydantic import ValidationError

from gpucost.config import ConfigError
from gpucost.flags import add_kafka
from gpucost.kafka.settings import KafkaSettings
from gpucost.wiring import kafka_settings

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}  # Kafka's record batch attribute


def test_zstd_is_the_default_and_none_sends_uncompressed() -> None:
    assert KafkaSettings().producer_options()["compression_type"] == "zstd"
    assert KafkaSettings(compression="none").producer_options()["compression_type"] is None
    options = KafkaSettings(bootstrap="b:1", compression="lz4").producer_options()
    assert options["bootstrap_servers"] == "b:1" and options["compression_type"] == "lz4"


@pytest.mark.parametrize("name", sorted(CODECS))
def test_every_accepted_compression_round_trips_in_this_install(name: str) -> None:
    """A setting the settings accept but aiokafka cannot encode would fail only at a producer's
    first send; here each one encodes a batch as Kafka lays it out and reads it back."""
    assert KafkaSettings(compression=name).compression == name
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=CODECS[name],
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    values = [b'{"kind":"gpu_sample","n":%d}' % i * 20 for i in range(50)]
    for i, value in enumerate(values):
        builder.append(i, timestamp=None, key=b"k", value=value, headers=[])
    reader = DefaultRecordBatch(bytes(builder.build()))
    assert reader.compression_type == CODECS[name]
    assert [r.value for r in reader] == values


def test_a_compression_kafka_does_not_know_is_refused_with_the_choices() -> None:
    with pytest.raises(ValidationError, match="zstd"):
        KafkaSettings(compression="brotli")
    p = argparse.ArgumentParser()
    add_kafka(p)
    with pytest.raises(ConfigError, match="compression"):
        kafka_settings(p.parse_args(["--compression", "brotli"]))


def test_the_test_broker_takes_a_block_of_ports_nothing_listens_on() -> None:
    """Two test sessions on one host must not share a broker port: a block with a port in use is passed over."""
    import random
    import socket

    from tests.conftest import free_ports

    first = free_ports(4, random.Random(5))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", first + 2))
        taken.listen()
        second = free_ports(4, random.Random(5))  # the same first candidate, now with a port in use
    assert second != first and not second <= first + 2 < second + 4
