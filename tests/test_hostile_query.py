"""Hostile input to the query shell (issue 35): SQL that writes, under every prefix DuckDB accepts.

``gpucost query`` is read-only by two layers, each measured here with the other switched off:

- the statement check (sinks/statements.py) refuses each attack before a connection is opened, with
  one line naming what it refused and ``--unsafe``;
- with that check accepting everything, the kernel (sinks/landlock.py) still refuses each write: the
  output's files hash the same, the bill summed from them (pyarrow, not the views) is unchanged, and
  no file appears in the working directory (where DuckDB spills, ``.tmp``, by default), ``tmp_path``
  or the home directory (where DuckDB keeps extensions and persistent secrets).

Every attack runs over the output of ``gpucost replay`` in both configurations (``horizon``).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from gpucost import commands
from gpucost.cli import main
from gpucost.streams.settings import AuditSettings
from tests.conftest import HOSTILE_LINES, horizon_label

_OUTPUTS: dict[str, Path] = {}


@pytest.fixture
def out(horizon: AuditSettings, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]) -> Path:
    """A replayed output, made once per configuration for the module (the attacks must leave it as it is)."""
    label = horizon_label(horizon)
    if label not in _OUTPUTS:
        base = tmp_path_factory.mktemp(f"query-{label}")
        assert main(["simulate", "--gpus", "1", "--hours", "0.2", "--out", str(base / "events")]) == 0
        assert main(["replay", str(base / "events"), "--out", str(base / "out")]) == 0
        _OUTPUTS[label] = base / "out"
    capsys.readouterr()
    return _OUTPUTS[label]


def _said(err: str) -> str:
    """The error's first line, short, for a summary line."""
    return err.removeprefix("gpucost: error: ").split("\n")[0][:64] if err else "answered"


#: (attack, SQL with {bill}: a published cost file, {day}: its folder, {out}: the output directory, what the check
#: names)
ATTACKS = [
    ("COPY over a cost file", "COPY (SELECT 1 AS x) TO '{bill}' (FORMAT parquet)", "not COPY;"),
    (
        "COPY over a cost file in place",
        "COPY (SELECT 1 AS x) TO '{bill}' (FORMAT parquet, USE_TMP_FILE false)",
        "not COPY;",
    ),
    ("EXPLAIN COPY", "EXPLAIN COPY (SELECT 1 AS x) TO '{bill}' (FORMAT parquet)", "COPY in EXPLAIN;"),
    (
        "EXPLAIN ANALYZE COPY",
        "EXPLAIN ANALYZE COPY (SELECT 1 AS x) TO '{bill}' (FORMAT parquet)",
        "COPY in EXPLAIN ANALYZE;",
    ),
    (
        "EXPLAIN (options) COPY",
        "EXPLAIN (FORMAT json) COPY (SELECT 1 AS x) TO '{bill}' (FORMAT parquet)",
        "COPY in EXPLAIN;",
    ),
    (
        "WITH holding a COPY",
        "WITH c AS (COPY (SELECT 1 AS x) TO '{bill}' (FORMAT parquet)) SELECT 1",
        "COPY in a SELECT;",
    ),
    (
        "EXPLAIN ANALYZE WITH holding a COPY",
        "EXPLAIN ANALYZE WITH c AS (COPY (SELECT 1 AS x) TO '{bill}' (FORMAT parquet)) SELECT 1",
        "COPY in a SELECT in EXPLAIN ANALYZE;",
    ),
    ("COPY of a PIVOT", "COPY (PIVOT cost ON team USING sum(cost_micro_usd)) TO '{bill}' (FORMAT parquet)", "MULTI"),
    (
        "PREPARE a COPY, EXECUTE it",
        "PREPARE p AS COPY (SELECT 1 AS x) TO '{bill}' (FORMAT parquet); EXECUTE p",
        "COPY in PREPARE;",
    ),
    (
        "second statement after ;",
        "SELECT 1; COPY (SELECT * FROM cost) TO '{day}/extra.parquet' (FORMAT parquet)",
        "COPY;",
    ),
    (
        "comments and odd casing",
        "/* hi */ eXpLaIn\n\tAnAlYzE -- there\n cOpY (SeLeCt 1 AS x) To '{bill}' (FORMAT parquet)",
        "COPY in EXPLAIN ANALYZE;",
    ),
    (
        "query() holding a COPY",
        "SELECT * FROM query('WITH c AS (COPY (SELECT 1 AS x) TO ''{bill}'' (FORMAT parquet)) SELECT 1')",
        "table function query() in a SELECT;",
    ),
    ("EXPORT DATABASE", "EXPORT DATABASE '{out}/dump'", "EXPORT;"),
    ("ATTACH", "ATTACH '{out}/x.db'", "ATTACH;"),
    ("INSTALL", "INSTALL httpfs", "LOAD;"),
    ("LOAD", "LOAD '{out}/x.duckdb_extension'", "LOAD;"),
    ("SET of a file setting", "SET temp_directory = '{out}'", "SET;"),
    ("RESET", "RESET lock_configuration", "SET;"),
    ("PRAGMA", "PRAGMA enable_profiling", "PRAGMA;"),
    ("CALL", "CALL enable_logging(storage = 'file', storage_path = '{out}/log')", "CALL;"),
    ("CHECKPOINT", "CHECKPOINT", "CALL;"),
    ("CREATE SECRET", "CREATE PERSISTENT SECRET s (TYPE s3, KEY_ID 'a', SECRET 'b')", "CREATE;"),
]


def _sql(template: str, out: Path) -> str:
    bill = sorted(out.glob("cost/date=*/*.parquet"))[0]
    return template.format(bill=bill, day=bill.parent, out=out)


def _hashes(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _billed(out: Path) -> int:
    """The µ$ in the published cost files, read with pyarrow (not through the views under attack)."""
    return sum(
        sum(pq.read_table(p, columns=["cost_micro_usd"])["cost_micro_usd"].to_pylist())
        for p in out.glob("cost/**/*.parquet")
    )


@pytest.mark.parametrize("attack,template,named", ATTACKS, ids=[a[0] for a in ATTACKS])
def test_the_statement_check_refuses_each_writer_under_every_prefix(
    attack: str,
    template: str,
    named: str,
    out: Path,
    horizon: AuditSettings,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: list[str] = []
    monkeypatch.setattr(commands, "query", lambda *args, **kw: ran.append("ran") or ([], []))
    rc = main(["query", "--out", str(out), _sql(template, out)])
    err = capsys.readouterr().err
    HOSTILE_LINES.append(
        f"query: {attack:<36} {horizon_label(horizon):<5} statement check | exit {rc}, "
        f"{'not run' if not ran else 'RUN'} | {_said(err)[-64:]}"
    )
    assert rc == 2 and not ran, f"{attack}: the check let it through ({err!r})"
    assert err.startswith("gpucost: error: ") and err.count("\n") == 1
    assert named in err and "--unsafe" in err


@pytest.mark.parametrize("attack,template,named", ATTACKS, ids=[a[0] for a in ATTACKS])
def test_the_kernel_refuses_each_write_the_statement_check_let_through(
    attack: str,
    template: str,
    named: str,
    out: Path,
    horizon: AuditSettings,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(commands, "read_only_problem", lambda sql: None)  # the statement check, switched off
    cwd, home = tmp_path / "cwd", tmp_path / "home"
    cwd.mkdir(), home.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("HOME", str(home))
    before, billed = _hashes(out), _billed(out)
    rc = main(["query", "--out", str(out), _sql(template, out)])
    err = capsys.readouterr().err
    after, created = _hashes(out), sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    same = after == before and not created
    HOSTILE_LINES.append(
        f"query: {attack:<36} {horizon_label(horizon):<5} check off, kernel | exit {rc} "
        f"{_said(err)} | µ$ billed {_billed(out):,} vs {billed:,}, "
        f"{len(before)} files {'unchanged OK' if same else 'WRITTEN'}"
    )
    assert after == before, f"{attack} changed the output: {set(after.items()) ^ set(before.items())}"
    assert not created, f"{attack} created {created}"
    assert rc == 0 or (rc == 2 and err.count("\n") == 1 and err.startswith("gpucost: error: query failed"))


def test_analysts_keep_every_read_and_nothing_is_written(
    out: Path,
    horizon: AuditSettings,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    files = sorted(out.glob("cost/**/*.parquet"))
    billed, rows = _billed(out), sum(pq.read_metadata(p).num_rows for p in files)
    before = _hashes(out)
    reads = {  # SQL: what it must answer (None: that it answers), each from the files, not the views
        "SELECT sum(cost_micro_usd) AS v FROM cost": billed,
        "WITH c AS (SELECT * FROM cost) SELECT sum(cost_micro_usd) AS v FROM c": billed,
        "PREPARE p AS SELECT count(*) AS v FROM cost; EXECUTE p": rows,
        f"SELECT sum(cost_micro_usd) AS v FROM read_parquet('{out}/cost/**/*.parquet')": billed,
        f"SELECT count(*) AS v FROM glob('{out}/cost/**/*.parquet')": len(files),
        "PIVOT (SELECT revision FROM cost) ON revision IN (0) USING count(*)": None,
        "EXPLAIN SELECT count(*) FROM cost": None,
        "EXPLAIN ANALYZE SELECT count(*) FROM cost": None,
        "DESCRIBE cost": None,
        "SUMMARIZE SELECT cost_micro_usd FROM cost": None,
        "SHOW TABLES": None,
        "SELECT current_setting('temp_directory') AS v": "",  # spilling to memory only
    }
    for sql, want in reads.items():
        assert main(["query", "--out", str(out), "--format", "json", sql]) == 0, capsys.readouterr().err
        answer = json.loads(capsys.readouterr().out)
        assert want is None or answer[0]["v"] == want, (sql, answer)
    assert main(["query", "--out", str(out), "EXPLAIN ANALYZE SELECT * FROM read_text('/etc/passwd')"]) == 2
    assert "Permission Error" in capsys.readouterr().err  # reads stay inside the output directory
    assert _hashes(out) == before and not list(tmp_path.iterdir())
    (tmp_path / "still-writable").write_text("")  # the restriction ended with the query's thread
    HOSTILE_LINES.append(
        f"query: {len(reads)} reads (SELECT, WITH, PREPARE, read_parquet, glob, PIVOT, EXPLAIN, "
        f"DESCRIBE, SUMMARIZE, SHOW) {horizon_label(horizon)} | all answered, µ$ {billed:,} | "
        "no file written OK"
    )


@pytest.mark.parametrize("sql", ["", " ;; -- nothing\n"])
def test_a_query_of_no_statement_is_a_usage_error_not_a_traceback(
    sql: str, out: Path, horizon: AuditSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["query", "--out", str(out), sql])
    err = capsys.readouterr().err
    HOSTILE_LINES.append(f"query: no statement {sql!r} {horizon_label(horizon)} | exit {rc} | {_said(err)}")
    assert rc == 2 and err.startswith("gpucost: error: ") and err.count("\n") == 1
    assert main(["query", "--unsafe", "--out", str(out), sql]) == 0


def test_without_landlock_the_query_is_refused_not_run_unguarded(
    out: Path, horizon: AuditSettings, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gpucost.sinks.landlock.CREATE_RULESET", -1)  # a system call the kernel does not have: ENOSYS
    rc = main(["query", "--out", str(out), "SELECT count(*) FROM cost"])
    err = capsys.readouterr().err
    HOSTILE_LINES.append(f"query: a kernel without Landlock {horizon_label(horizon)} | exit {rc} | {_said(err)}")
    assert rc == 2 and err.startswith("gpucost: error: ") and err.count("\n") == 1
    assert "Landlock" in err and "--unsafe" in err
    assert main(["query", "--unsafe", "--out", str(out), "SELECT count(*) FROM cost"]) == 0


def test_query_is_read_only_and_confined_to_the_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["simulate", "--gpus", "1", "--hours", "0.2", "--out", str(tmp_path / "events")]) == 0
    assert main(["replay", str(tmp_path / "events"), "--out", str(out)]) == 0
    capsys.readouterr()
    for sql in (
        "COPY (SELECT 1) TO '" + str(out / "x.csv") + "'",
        "SELECT * FROM read_text('/etc/passwd')",
        "ATTACH '" + str(tmp_path / "x.db") + "'",
        "SET enable_external_access = true",
    ):
        assert main(["query", "--out", str(out), sql]) == 2, sql
        assert "gpucost: error" in capsys.readouterr().err
    assert not (out / "x.csv").exists() and not (tmp_path / "x.db").exists()
    assert main(["query", "--out", str(out), "SELECT count(*) FROM cost"]) == 0
    assert main(["query", "--unsafe", "--out", str(out), f"COPY (SELECT 1) TO '{tmp_path / 'y.csv'}'"]) == 0
    assert (tmp_path / "y.csv").exists()
