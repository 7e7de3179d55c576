"""Prometheus text scrapes read exactly: each sample's value as the decimal the exporter wrote."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal

from prometheus_client.parser import text_string_to_metric_families

from gpucost.producers.accelerators.capture import body
from gpucost.schemas.devices import Parsed, UnitError, number

__all__ = ["series"]


def series(text: str, out: Parsed, wanted: set[str]) -> Iterator[tuple[str, dict[str, str], Decimal]]:
    """(name, labels, value) of each sample of the ``wanted`` metrics; a bad scrape is counted, not raised."""
    lines = [line for line in body(text) if line.strip()]
    try:
        for family in text_string_to_metric_families("\n".join(lines) + "\n"):
            for sample in family.samples:
                if sample.name not in wanted:
                    continue
                try:
                    yield sample.name, sample.labels, number(sample.value)
                except UnitError as exc:
                    out.reject(f"{sample.name}: {exc}")
    except ValueError as exc:
        out.reject(f"Prometheus text: {exc}")
