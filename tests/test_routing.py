"""Routing: one auditor per Kafka key, fed only its key's stream, equals the single embedded auditor."""

from __future__ import annotations

import pytest
from hypothesis import given

from gpucost.kafka.routing import Router, duplicate_letter
from gpucost.schemas.events import Event
from gpucost.schemas.records import Output
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings
from tests.strategies import settings_st, streams
from tests.support.tabulate import run, tabulate


def keyed_run(events: list[Event], s: AuditSettings) -> list[Output]:
    router = Router()
    streams_by_key: dict[tuple[str, str], list[Event]] = {}
    for ev in events:
        for topic, key, routed in router.route(ev):
            streams_by_key.setdefault((topic, key), []).append(routed)
    out: list[Output] = []
    for (topic, key), evs in streams_by_key.items():
        if topic == "dlq":
            out += [duplicate_letter(ev, key) for ev in evs]  # type: ignore[arg-type]
            continue
        if topic in ("bindings", "prices"):
            continue  # durable records; the auditors get their copies in-stream
        auditor = Auditor(s)
        for ev in evs:
            out += auditor.update(ev)
        out += auditor.finish()
    return out


@pytest.mark.slow
@given(streams(), settings_st(revisions=True))
def test_per_key_auditors_equal_the_embedded_auditor(events: list[Event], s: AuditSettings) -> None:
    assert tabulate(keyed_run(events, s)) == tabulate(run(events, s))


@pytest.mark.slow
@given(streams(max_span_s=600))
def test_every_event_is_routed_and_durable_records_are_kept(events: list[Event]) -> None:
    router = Router()
    for ev in events:
        unchanged = router.unchanged_bindings
        routes = router.route(ev)
        assert routes, "every event goes somewhere: a repeat of a binding too, since a later one may fall before it"
        if ev.kind == "tenant_binding" and router.unchanged_bindings == unchanged + 1:
            assert routes[0][0] == "bindings"
        assert any(r[2] is ev for r in routes)
        if ev.kind in ("tenant_binding", "price") and routes[0][0] != "dlq":
            assert routes[0][0] == ev.kind.replace("tenant_binding", "bindings").replace("price", "prices")
