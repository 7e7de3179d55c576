"""Prometheus text scrapes read exactly: each sample's value as the decimal the exporter wrote, under
the name it wrote it.

prometheus_client's text parser gives a counter whose ``# TYPE`` line names it without ``_total``
(dcgm-exporter's ``DCGM_FI_DEV_PCIE_REPLAY_COUNTER``, ``DCGM_FI_DEV_ECC_SBE_VOL_TOTAL``: the suffix
is case-sensitive) its OpenMetrics name, the written name + ``_total``; ``series`` hands such a
sample back under the written name, as every parser's table keys it. A counter typed with ``_total``
(``execution_errors_total``) is left as the parser reads it: its samples keep their written name.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from decimal import Decimal

from gpucost.producers.accelerators.capture import body
from gpucost.producers.scrape import families
from gpucost.schemas.devices import Parsed, UnitError, number

__all__ = ["series"]


def _counters_suffixed(lines: list[str]) -> set[str]:
    """The counters whose ``# TYPE`` line names them without ``_total``: the parser suffixes their samples."""
    types = (line.split() for line in lines if line.lstrip().startswith("#"))
    return {p[2] for p in types if p[:2] == ["#", "TYPE"] and p[3:4] == ["counter"] and not p[2].endswith("_total")}


def series(
    text: str,
    out: Parsed,
    wanted: set[str],
    every: Callable[[str, dict[str, str]], object] | None = None,
    strict: bool = False,
) -> Iterator[tuple[str, dict[str, str], Decimal]]:
    """(name, labels, value) of each sample of the ``wanted`` metrics; a bad scrape is counted, not raised (with
    ``strict``, a text with no sample at all raises ValueError: a live source says its URL serves no metrics). Read
    as the billing sources read a scrape (``gpucost.producers.scrape.families``: a byte-order mark dropped, and a text
    one bad line spoils read line by line), each such line counted, so that one line never costs the rest. ``every``
    is called with the name and labels of every sample, wanted or not, before its value is read."""
    lines = [line for line in body(text) if line.strip()]
    suffixed = _counters_suffixed(lines)
    bad: Counter[str] = Counter()
    try:
        found = families("\n".join(lines) + "\n", bad)
    except ValueError as exc:
        if strict:
            raise
        out.reject(f"Prometheus text: {exc}")
        return
    for _ in range(bad["line_unparseable"]):
        out.reject("Prometheus text: a line that is no sample, skipped")
    for family in found:
        written = family.name if family.type == "counter" and family.name in suffixed else None
        for sample in family.samples:
            name = written if written and sample.name == written + "_total" else sample.name
            if every is not None:
                every(name, sample.labels)
            if name not in wanted:
                continue
            try:
                yield name, sample.labels, number(sample.value)
            except UnitError as exc:
                out.reject(f"{name}: {exc}")
