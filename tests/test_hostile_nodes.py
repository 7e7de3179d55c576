"""Hostile input from a node's own key: no node may speak for another.

A node's key may not set prices, end or sample another GPU, or sign for another node; an unsigned price is refused
unless its signer may set prices; one parser decides what a line is, on both paths; and the lines of several GPUs in
one GPU's message are refused exactly alike by the row and the batch path. Driven without a broker
(``tests.fake_kafka``); at the end of the session pytest prints one line per attack.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpucost.kafka.settings import KafkaSettings
from gpucost.kafka.signing import Keyring
from gpucost.kafka.worker import Worker
from gpucost.schemas.blocks import expand
from gpucost.schemas.topics import CONTROL_HEADER, END_OF_INPUT
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings
from tests.support.hostile import (
    CONFIGS,
    KEY,
    SECRET_A,
    SECRET_B,
    SECRET_P,
    apply,
    billed,
    expected_micro_usd,
    keyring,  # noqa: F401 (a fixture)
    letters,
    report,
    sign_prices,
    signed,
)
from tests.support.worker_input import LINES

# --- no node may speak for another --------------------------------------------------------------------


@CONFIGS
def test_a_node_key_cannot_forge_prices_end_other_gpus_or_sign_their_samples(
    audit: AuditSettings, keyring: Keyring
) -> None:
    lines = sign_prices(LINES[KEY])
    want = expected_micro_usd(lines, audit)
    worker = Worker(KafkaSettings(), audit, group="g", keyring=keyring)
    forged_price = json.dumps(
        {"kind": "price", "gpu_model": "default", "ts_ns": 1736035200000000001, "usd_per_gpu_hour": "0"}
    ).encode()
    other_gpu = next(line for line in LINES[list(LINES)[1]] if b'"gpu_sample"' in line)
    own_sample = next(line for line in lines if b'"process_sample"' in line)
    messages = [
        signed(KEY, b"\n".join(lines), SECRET_A, "node-a"),
        signed(KEY, forged_price, SECRET_A, "node-a", offset=1),  # a node's price: unsigned by the authority
        signed(KEY, other_gpu, SECRET_A, "node-a", offset=2),  # another GPU's sample under this key
        signed(KEY, own_sample.replace(b"node-000", b"node-001"), SECRET_B, "node-b", offset=3),  # node-b on a's GPU
        signed(KEY, b"", SECRET_B, "node-b", [(CONTROL_HEADER, END_OF_INPUT)], offset=4),  # node-b ends a's GPU
        signed(KEY, b"", SECRET_A, "node-a", [(CONTROL_HEADER, END_OF_INPUT)], offset=5),
    ]
    out, owned = apply(worker, messages)
    reasons = Counter(d.reason for d in letters(out))
    report("node key: price, other GPU, foreign node, end", len(lines) + 4, letters(out), billed(out), want, audit)
    assert billed(out) == want
    assert reasons == {"unsigned": 1, "wrong_key": 3}
    assert owned.owners == {KEY.decode(): "node-000"}


@CONFIGS
def test_unsigned_prices_are_refused_unless_the_signer_may_set_prices(
    audit: AuditSettings, keyring: Keyring, tmp_path: Path
) -> None:
    worker = Worker(KafkaSettings(), audit, group="g", keyring=keyring)
    out, _ = apply(worker, [signed(KEY, b"\n".join(LINES[KEY]), SECRET_A, "node-a")])
    prices = sum(1 for line in LINES[KEY] if b'"price"' in line)
    assert Counter(d.reason for d in letters(out))["unsigned"] == prices > 0
    # a key of any node (``*``), as a single-key deployment has, vouches for the prices it carries
    (tmp_path / "admin").write_text(f"admin {SECRET_P.hex()} *\n")
    worker = Worker(KafkaSettings(), audit, group="g", keyring=Keyring(tmp_path / "admin"))
    out, _ = apply(worker, [signed(KEY, b"\n".join(LINES[KEY]), SECRET_P, "admin")])
    assert not letters(out)


@pytest.mark.parametrize("padding", [10, 200])  # the row path (few lines) and the batch path
@CONFIGS
def test_one_parser_decides_what_a_line_is(audit: AuditSettings, padding: int, keyring: Keyring) -> None:
    """A number of 4,400 digits: Python's json refuses the line, Arrow's reader took it; so 128+ padded
    lines once passed as another node's. Both paths now refuse it the same way."""
    huge = b'{"kind":"gpu_sample","pad":' + b"7" * 4400 + b"," + LINES[KEY][-1].split(b"{", 1)[1]
    lines = [huge.replace(b"node-000", b"node-001")] * padding
    row = Auditor(audit)
    want = [(d.reason, d.kind) for d in (row.ingest(line, "x")[0] for line in lines)]
    worker = Worker(KafkaSettings(), audit, group="g", keyring=keyring)
    out, _ = apply(worker, [signed(KEY, b"\n".join(lines), SECRET_A, "node-a")])
    assert [(d.reason, d.kind) for d in letters(out)] == want == [("malformed_json", None)] * padding
    report(f"4,400-digit numbers, {padding} lines", padding, letters(out), billed(out), 0, audit)


# --- lines of several GPUs in one message -------------------------------------------------------------


@pytest.mark.slow
@given(
    st.lists(st.tuples(st.integers(0, len(LINES) - 1), st.integers(0, 10_000)), min_size=130, max_size=260),
    st.sampled_from([None, frozenset({"node-000"}), frozenset({"node-001"})]),
)
@CONFIGS
def test_both_paths_refuse_what_a_message_may_not_carry(
    audit: AuditSettings, picks: list[tuple[int, int]], nodes: frozenset[str] | None
) -> None:
    """Lines of several GPUs in a message of one: the batch path (here, 130+ lines) refuses exactly the
    lines, and for the reasons, the row path refuses (a mutation of either check fails this)."""
    from gpucost.streams.scope import Scope

    keys = list(LINES)
    lines = [LINES[keys[k]][i % len(LINES[keys[k]])] for k, i in picks]
    scope = Scope(KEY.decode(), nodes)
    row = Auditor(audit)
    want = [out for i, line in enumerate(lines) for out in row.ingest(line, str(i), scope)]
    batch = Auditor(audit)
    got = expand(batch.ingest_lines(lines, str, scope))
    assert [(d.reason, d.source) for d in letters(got)] == [(d.reason, d.source) for d in letters(want)]
    got, want = got + batch.finish(), want + row.finish()
    assert [r.model_dump() for r in got] == [r.model_dump() for r in want]
