"""The hostile-input suite's kit: the two configurations every attack runs in, one GPU's stream and the keys that
sign it, the worker driven without a broker, and the summary line each attack prints at the end of the session
(tests/conftest.py's HOSTILE_LINES)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from aiokafka import TopicPartition

from gpucost.kafka.owned import Owned
from gpucost.kafka.signing import Keyring, Signer, parse_keys
from gpucost.kafka.worker import Worker
from gpucost.schemas.blocks import expand
from gpucost.schemas.codec import decode_line
from gpucost.schemas.events import Price
from gpucost.schemas.records import CostRecord, DeadLetter
from gpucost.streams.audit import Auditor
from gpucost.streams.scope import price_mac
from gpucost.streams.settings import AuditSettings
from tests.conftest import HOSTILE_LINES, horizon_label
from tests.fake_kafka import Message, RecordingProducer
from tests.support.worker_input import LINES

#: every attack runs in the default configuration (a 6 h revision horizon) and with revisions off: a guarantee that
#: holds only with a feature off does not hold
CONFIGS = pytest.mark.parametrize(
    "audit", [AuditSettings(), AuditSettings(revision_horizon_s=0)], ids=["revisions-default", "revisions-off"]
)
TP = TopicPartition("gpucost.events", 3)
KEY = next(iter(LINES))  # one GPU's stream: prices, bindings, samples
SECRET_A, SECRET_B, SECRET_P = b"a" * 32, b"b" * 32, b"p" * 32
KEYRING = f"node-a {SECRET_A.hex()} node-000\nnode-b {SECRET_B.hex()} node-001\nprices {SECRET_P.hex()} @prices\n"


def report(attack: str, sent: int, letters: list[DeadLetter], billed: int, expected: int, audit: AuditSettings) -> None:
    reasons = dict(sorted(Counter(d.reason for d in letters).items()))
    HOSTILE_LINES.append(
        f"{horizon_label(audit):<5} {attack:<44} sent {sent:>6,} | refused {len(letters):>5,} "
        f"{reasons or ''} | "
        f"µ$ billed {billed:,} vs expected {expected:,} {'OK' if billed == expected else 'MISMATCH'}"
    )


def line(attack: str, settings_: AuditSettings | None, sent: str, refused: str, outcome: str) -> None:
    """The summary line of an attack on a consumer of the records (discovery, reclaim), which bills nothing."""
    where = "" if settings_ is None else f" [{horizon_label(settings_)}]"
    HOSTILE_LINES.append(f"{attack + where:<44} sent {sent} | refused {refused} | {outcome}")


def expected_micro_usd(lines: list[bytes], audit: AuditSettings) -> int:
    """The embedded run's bill for ``lines`` sent once."""
    auditor = Auditor(audit)
    out = expand(auditor.ingest_lines(lines, str)) + auditor.finish()
    return sum(r.cost_micro_usd for r in out if isinstance(r, CostRecord))


def apply(worker: Worker, messages: list[Message], owned: Owned | None = None) -> tuple[list, Owned]:
    owned = owned or Owned(RecordingProducer(), {}, {}, 0)  # type: ignore[arg-type]
    return worker.apply(owned, messages, set(), Counter()), owned


def billed(out: list) -> int:
    return sum(r.cost_micro_usd for r in out if isinstance(r, CostRecord))


def letters(out: list) -> list[DeadLetter]:
    return [r for r in out if isinstance(r, DeadLetter)]


def signed(
    key: bytes,
    value: bytes,
    secret: bytes,
    key_id: str,
    headers: list[tuple[str, bytes]] | None = None,
    offset: int = 0,
) -> Message:
    signer = Signer(parse_keys(f"{key_id} {secret.hex()}", "test")[key_id])
    headers = list(headers or [])
    return Message(key, value, offset, headers + signer.headers(key, value, dict(headers)))


@pytest.fixture
def keyring(tmp_path: Path) -> Keyring:
    path = tmp_path / "ring"
    path.write_text(KEYRING)
    return Keyring(path)


def sign_prices(lines: list[bytes]) -> list[bytes]:
    """The stream with each price signed by the price authority, as `gpucost prices sign` writes it."""
    out = []
    for line in lines:
        event = decode_line(line)
        if isinstance(event, Price):
            event = event.model_copy(update={"key_id": "prices", "signature": price_mac(SECRET_P, event)})
            line = json.dumps(event.to_wire()).encode()
        out.append(line)
    return out
