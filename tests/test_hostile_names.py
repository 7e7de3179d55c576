"""Hostile names: a team name made to read as a reserved one (``idle``, ``unattributed``) is refused as it reads,
and no control character reaches the terminal through a table.
"""

from __future__ import annotations

import json

import pytest

from gpucost.report import format_table
from gpucost.schemas.codec import decode_line
from gpucost.schemas.events import TenantBinding


@pytest.mark.parametrize(
    "team",
    [
        "idle ",
        "Idle",
        "idle\u00a0",
        "ıdle",
        "unattributed\u200b",
        "ＩＤＬＥ",
        "іdle",
        "un\u0301attributed",
        "IdIe",  # capital i for the l: the vertical strokes read alike
        "id1e",
        "unaIlocated",
        "una1located",
        "unaǀlocated",
        "ᴜnallocated",
        "unall0cated",
    ],
)
def test_reserved_team_names_are_matched_as_they_read(team: str) -> None:
    line = json.dumps(
        {
            "kind": "tenant_binding",
            "node_id": "n",
            "pid": 1,
            "ts_ns": 1736121600000000000,
            "team": team,
            "env": "",
            "app": "",
            "tier": "",
            "sla": "Gold",
        }
    )
    rejected = decode_line(line)
    assert not isinstance(rejected, TenantBinding) and rejected.reason == "invalid" and "reserved" in rejected.detail


def test_control_characters_never_reach_the_terminal() -> None:
    table = format_table(["team"], [["\x1b[2J\x1b[31mred"], ["zero\u200bwidth"]])
    assert "\x1b" not in table and "\u200b" not in table and "\\x1b[2J" in table
