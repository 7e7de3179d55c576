"""Hostile input, money and records: a node's key claiming another node's GPU, in the configuration users run (a 6 h
revision horizon) and with revisions off. The first message that names its signer's node on a GPU's key makes
that node the GPU's owner; a message that names no node (a relayed price) establishes nothing, and one that names
the signer's node (its bindings) does, so no other node can then bill or silence the GPU."""

from __future__ import annotations

import json
from pathlib import Path

from gpucost.kafka.settings import KafkaSettings
from gpucost.kafka.signing import Keyring
from gpucost.kafka.worker import Worker
from gpucost.schemas.blocks import expand
from gpucost.schemas.records import CostRecord
from gpucost.schemas.topics import CONTROL_HEADER, END_OF_INPUT
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings
from tests.support.hostile import (
    CONFIGS,
    KEY,
    KEYRING,
    SECRET_A,
    SECRET_B,
    apply,
    billed,
    letters,
    report,
    sign_prices,
    signed,
)
from tests.support.worker_input import LINES

__all__: list[str] = []


@CONFIGS
def test_a_node_key_cannot_take_another_nodes_gpu_with_a_message_that_names_no_node(
    audit: AuditSettings, tmp_path: Path
) -> None:
    """node-001's key signed a price-only message on a node-000 GPU's key first: the first key limited to one node
    that signed a message of a GPU made that node its owner, and node-000's own events were then refused as
    ``wrong_key`` (its bill lost). A message naming no node of its key now establishes nothing."""
    (tmp_path / "ring").write_text(KEYRING)
    lines = sign_prices(LINES[KEY])
    price = next(line for line in lines if b'"price"' in line)
    worker = Worker(KafkaSettings(), audit, group="g", keyring=Keyring(tmp_path / "ring"))
    out, owned = apply(
        worker,
        [
            signed(KEY, price, SECRET_B, "node-b"),  # a signed price relayed by node-001, on node-000's GPU
            signed(KEY, b"\n".join(lines), SECRET_A, "node-a", offset=1),
            signed(KEY, b"", SECRET_A, "node-a", [(CONTROL_HEADER, END_OF_INPUT)], offset=2),
        ],
    )
    auditor = Auditor(audit)
    want = sum(
        r.cost_micro_usd
        for r in expand(auditor.ingest_lines(lines, str)) + auditor.finish()
        if isinstance(r, CostRecord)
    )
    report("another node's price-only message first", len(lines) + 1, letters(out), billed(out), want, audit)
    assert "wrong_key" not in {d.reason for d in letters(out)}
    assert owned.owners == {KEY.decode(): "node-000"} and billed(out) == want


@CONFIGS
def test_a_nodes_binding_only_first_message_claims_its_gpu(audit: AuditSettings, tmp_path: Path) -> None:
    """node-000's first message on its GPU's key held only bindings (they name node-000, as the router copies them
    to its GPUs' keys): it established nothing, so node-001's key could then claim the GPU with a sample naming
    itself, and node-000's own events were refused as ``wrong_key``. A binding naming the signer's node claims."""
    (tmp_path / "ring").write_text(KEYRING)
    lines = sign_prices(LINES[KEY])
    bindings = [line for line in lines if b'"tenant_binding"' in line]
    rest = [line for line in lines if b'"tenant_binding"' not in line]
    foreign = next(line for line in rest if b'"process_sample"' in line).replace(b"node-000", b"node-001")
    worker = Worker(KafkaSettings(), audit, group="g", keyring=Keyring(tmp_path / "ring"))
    out, owned = apply(
        worker,
        [
            signed(KEY, b"\n".join(bindings), SECRET_A, "node-a"),
            signed(KEY, foreign, SECRET_B, "node-b", offset=1),  # node-001 names itself on node-000's GPU
            signed(KEY, b"\n".join(rest), SECRET_A, "node-a", offset=2),
            signed(KEY, b"", SECRET_A, "node-a", [(CONTROL_HEADER, END_OF_INPUT)], offset=3),
        ],
    )
    auditor = Auditor(audit)
    want = sum(
        r.cost_micro_usd
        for r in expand(auditor.ingest_lines(bindings + rest, str)) + auditor.finish()
        if isinstance(r, CostRecord)
    )
    report("a foreign node after a binding-only message", len(lines) + 1, letters(out), billed(out), want, audit)
    assert [d.reason for d in letters(out)] == ["wrong_key"] and json.loads(letters(out)[0].raw)[
        "node_id"
    ] == "node-001"
    assert owned.owners == {KEY.decode(): "node-000"} and billed(out) == want
