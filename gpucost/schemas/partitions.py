"""A partition's share of its whole device, as its ``gpu_model`` says it (docs/definitions.md, "Partitions").

A device split into equal partitions that all take the device's model (AMD compute partitions XCP, the
NeuronCores of a Neuron device, the TensorCores of a TPU chip) is billed as its partitions, each under the
model ``<device model> 1/<n>``. Its price and its peak are the whole device's, each partition paying and
judged at its share: ``n`` partitions of one device cost what the device costs, once, never ``n`` times.
A partition with a model of its own (an NVIDIA MIG profile, ``<model> MIG 1g.10gb``) is a device of that
model, priced by its own key.

The share travels in the model's text so that every stage that keys by model (panes, both paths, their
state, revisions, the Parquet records and SQL over them) carries it without a field of its own; this module
is the one place that writes and reads it, ``share_sql`` its reading in DuckDB's SQL.
"""

from __future__ import annotations

import re
from fractions import Fraction
from functools import lru_cache

__all__ = ["MAX_PARTITIONS", "device_share", "partition_model", "share_sql", "whole_device"]

#: more partitions than any device has: a larger count in a model's text is no share, only text
MAX_PARTITIONS = 1024
#: the whole text: ``fullmatch`` here and ``^…$`` in DuckDB's RE2 (whose ``$`` is the end of the text, where
#: Python's is also before a last newline); ``.`` matches no newline in either
_SHARE = re.compile(r"(.+) ([1-9][0-9]{0,3})/([1-9][0-9]{0,3})")


def partition_model(model: str, of: int) -> str:
    """The ``gpu_model`` of one of ``of`` equal partitions of a ``model`` device (``model`` itself when ``of`` is
    1: a device seen as one partition is billed whole)."""
    if not 1 <= of <= MAX_PARTITIONS:
        raise ValueError(f"{of} partitions of one device: a share is between 1/1 and 1/{MAX_PARTITIONS}")
    return model if of == 1 else f"{model} 1/{of}"


@lru_cache(maxsize=4096)
def device_share(gpu_model: str) -> tuple[str, Fraction]:
    """(the whole device's model, the share of it) of ``gpu_model``: ``("MI300X", 1/8)`` for ``"MI300X 1/8"``,
    ``(gpu_model, 1)`` for a model without a share. A text whose share is not a fraction of one device (over
    1, or over ``MAX_PARTITIONS`` parts) is no share: the whole text is the model, billed whole."""
    found = _SHARE.fullmatch(gpu_model)
    if found is None:
        return gpu_model, Fraction(1)
    num, den = int(found[2]), int(found[3])
    if num > den or den > MAX_PARTITIONS:
        return gpu_model, Fraction(1)
    return found[1], Fraction(num, den)


def whole_device(gpu_model: str) -> str:
    """``gpu_model`` where it names a whole device, as a price's must: a partition's model (``MI300X 1/8``) pays
    its share of its device's price, so a price of its own would never be used; ValueError saying which to price."""
    whole, _ = device_share(gpu_model)
    if whole != gpu_model:  # "X 1/8", and "X 1/1" too: a pane of either is priced as "X"
        raise ValueError(f"{gpu_model!r} is a partition's model: price the whole device, {whole!r}")
    return gpu_model


def share_sql(col: str) -> tuple[str, str]:
    """``device_share``'s share of the ``gpu_model`` column ``col`` in DuckDB's SQL, as (numerator, denominator)
    INTEGER expressions, (1, 1) for a model without one: the SQL that counts GPU-hours takes it exactly (a
    partition of 1/8 for an hour is an eighth of a GPU-hour)."""
    pattern = "^" + _SHARE.pattern.replace("'", "''") + "$"
    num, den = (f"TRY_CAST(regexp_extract({col}, '{pattern}', {g}) AS INTEGER)" for g in (2, 3))
    valid = f"(regexp_matches({col}, '{pattern}') AND {num} <= {den} AND {den} <= {MAX_PARTITIONS})"
    return f"(CASE WHEN {valid} THEN {num} ELSE 1 END)", f"(CASE WHEN {valid} THEN {den} ELSE 1 END)"
