"""The command line as a user meets it: errors, settings precedence, output formats."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from gpucost.cli import main
from gpucost.config import load_settings
from gpucost.kafka.settings import KafkaSettings
from gpucost.sinks.views import connect
from gpucost.streams.settings import AuditSettings

SMALL = ["--gpus", "2", "--hours", "2", "--interval-s", "30"]


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("events")
    assert main(["simulate", *SMALL, "--out", str(path)]) == 0
    return path


def pane_lengths_s(out: Path) -> set[int]:
    rows = connect(out).execute("SELECT DISTINCT (pane_end_ns - pane_start_ns) // 1e9 FROM idle_index").fetchall()
    return {int(r[0]) for r in rows}


def test_run_audits_a_simulated_fleet_and_says_so(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, out, err = cli(capsys, "run", *SMALL, "--out", str(tmp_path / "o"))
    assert rc == 0
    assert "running the simulated fleet" in err
    assert "GPUs with the highest 72 h idle index" in out and "Cost by team" in out
    # the summary's total equals the sum of every pane's cost in the Parquet
    con = connect(tmp_path / "o")
    (total,) = con.execute(
        "SELECT sum(pane_cost_micro_usd) FROM (SELECT DISTINCT gpu_uuid, pane_start_ns, pane_cost_micro_usd FROM cost)"
    ).fetchone()
    table = out.split("Cost by team")[1].split("\n\n")[0]  # up to the next section
    listed = sum(int(line.split()[1]) for line in table.splitlines()[3:] if line.strip() and line.split()[1].isdigit())
    assert listed == total > 0
    # the grade table's windows add up to the health records, and every GPU out of service is listed
    grades = out.split("by grade:")[1].split("\n\n")[0].splitlines()[3:]
    assert sum(int(line.split()[1]) for line in grades) == con.execute("SELECT count(*) FROM health").fetchone()[0] > 0
    out_of_service = {
        g
        for (g,) in con.execute(
            "SELECT gpu_uuid FROM health GROUP BY gpu_uuid "
            "HAVING arg_max(breaker_state, window_start_ns) IN ('removed', "
            "'probation')"
        ).fetchall()
    }
    listed = out.split("GPUs out of service")[1].split("\n\n")[0] if "GPUs out of service" in out else ""
    assert out_of_service == {g for g in listed.split() if g.startswith("GPU-")}


def test_missing_input_is_one_clear_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, out, err = cli(capsys, "replay", str(tmp_path / "nope"), "--out", str(tmp_path / "o"))
    assert rc == 2 and err.count("\n") == 1 and "nope" in err and "does not exist" in err


@pytest.mark.parametrize(
    "args,env,words",
    [
        (["--pane-s", "0"], {}, "pane_s"),
        (["--pane-s", "abc"], {}, "pane_s"),
        (["--alpha", "0", "--beta", "0", "--gamma", "0"], {}, "alpha, beta and gamma are all 0"),
        (["--mae-lo", "10", "--mae-hi", "5"], {}, "mae_hi"),
        ([], {"GPUCOST_LATENESS_S": "-1"}, "lateness_s"),
    ],
)
def test_invalid_settings_are_refused_by_name(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    events: Path,
    tmp_path: Path,
    args: list[str],
    env: dict,
    words: str,
) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    rc, _, err = cli(capsys, "replay", str(events), "--out", str(tmp_path / "o"), *args)
    assert rc == 2 and words in err and err.startswith("gpucost: error: invalid setting")
    assert not (tmp_path / "o").exists()  # refused before anything was written


def test_settings_precedence_flag_over_env_over_file(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, events: Path, tmp_path: Path
) -> None:
    conf = tmp_path / "gpucost.toml"
    conf.write_text("pane_s = 300\nl2_calibration = [[1.0, 2.0], [3.0, 4.0]]\n")
    assert cli(capsys, "replay", str(events), "--out", str(tmp_path / "a"), "--config", str(conf))[0] == 0
    assert pane_lengths_s(tmp_path / "a") == {300}
    monkeypatch.setenv("GPUCOST_PANE_S", "600")
    assert cli(capsys, "replay", str(events), "--out", str(tmp_path / "b"), "--config", str(conf))[0] == 0
    assert pane_lengths_s(tmp_path / "b") == {600}
    assert (
        cli(capsys, "replay", str(events), "--out", str(tmp_path / "c"), "--config", str(conf), "--pane-s", "120")[0]
        == 0
    )
    assert pane_lengths_s(tmp_path / "c") == {120}


def test_only_the_command_line_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A settings object built in code (an operator, a test, a library user) gets what it is given, whatever
    the shell exports; the CLI's loader is the one place that reads GPUCOST_*."""
    monkeypatch.setenv("GPUCOST_PANE_S", "600")
    monkeypatch.setenv("GPUCOST_KAFKA_BOOTSTRAP", "elsewhere:9092")
    assert AuditSettings().pane_s == AuditSettings.model_fields["pane_s"].default != 600
    assert KafkaSettings().bootstrap == KafkaSettings.model_fields["bootstrap"].default != "elsewhere:9092"
    assert load_settings().pane_s == 600


@pytest.mark.parametrize("text,words", [("pane = 3\n", "unknown setting(s) pane"), ("pane_s = \n", "not valid TOML")])
def test_bad_config_files(
    capsys: pytest.CaptureFixture[str], events: Path, tmp_path: Path, text: str, words: str
) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text(text)
    rc, _, err = cli(capsys, "replay", str(events), "--out", str(tmp_path / "o"), "--config", str(conf))
    assert rc == 2 and words in err


def test_existing_output_needs_overwrite(capsys: pytest.CaptureFixture[str], events: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    assert cli(capsys, "replay", str(events), "--out", str(out))[0] == 0
    rc, _, err = cli(capsys, "replay", str(events), "--out", str(out))
    assert rc == 2 and "--overwrite" in err
    before = connect(out).execute("SELECT count(*) FROM cost").fetchone()
    assert cli(capsys, "replay", str(events), "--out", str(out), "--overwrite")[0] == 0
    assert connect(out).execute("SELECT count(*) FROM cost").fetchone() == before  # replaced, not appended


def test_query_formats_agree(capsys: pytest.CaptureFixture[str], events: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    main(["replay", str(events), "--out", str(out)])
    capsys.readouterr()
    sql = "SELECT team, sum(cost_micro_usd) AS micro_usd FROM cost GROUP BY team ORDER BY team"
    want = connect(out).execute(sql).fetchall()
    rc, text, _ = cli(capsys, "query", sql, "--out", str(out), "--format", "csv")
    assert rc == 0
    assert [(r["team"], int(r["micro_usd"])) for r in csv.DictReader(io.StringIO(text))] == want
    rc, text, _ = cli(capsys, "query", sql, "--out", str(out), "--format", "json")
    assert [(r["team"], r["micro_usd"]) for r in json.loads(text)] == want
    rc, text, _ = cli(capsys, "query", sql, "--out", str(out))
    assert text.splitlines()[0].split() == ["team", "micro_usd"] and len(text.splitlines()) == len(want) + 2


def test_query_errors(capsys: pytest.CaptureFixture[str], events: Path, tmp_path: Path) -> None:
    rc, _, err = cli(capsys, "query", "SELECT 1", "--out", str(tmp_path / "none"))
    assert rc == 2 and "does not exist" in err
    main(["replay", str(events), "--out", str(tmp_path / "o")])
    capsys.readouterr()
    rc, _, err = cli(capsys, "query", "SELECT nope FROM cost", "--out", str(tmp_path / "o"))
    assert rc == 2 and err.count("\n") == 1 and "nope" in err


def test_views_sql_works_in_a_plain_duckdb(capsys: pytest.CaptureFixture[str], events: Path, tmp_path: Path) -> None:
    import duckdb

    out = tmp_path / "o"
    main(["replay", str(events), "--out", str(out)])
    capsys.readouterr()
    rc, sql, _ = cli(capsys, "views", "--out", str(out))
    con = duckdb.connect()
    con.execute(sql)
    assert (
        con.execute("SELECT count(*) FROM cost").fetchone()
        == connect(out).execute("SELECT count(*) FROM cost").fetchone()
    )
    assert con.execute("SELECT count(*) FROM cost").fetchone()[0] > 0


def test_empty_views_have_the_schema_columns(tmp_path: Path) -> None:
    from gpucost.schemas.arrow import ARROW_SCHEMAS

    con = connect(tmp_path)
    for kind, schema in ARROW_SCHEMAS.items():
        res = con.execute(f"SELECT * FROM {kind}")
        assert [d[0] for d in res.description] == schema.names + ["date"] and res.fetchall() == []


@pytest.mark.parametrize("command", ["run", "simulate", "replay", "query", "views"])
def test_help_renders(capsys: pytest.CaptureFixture[str], command: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0 and "--out" in capsys.readouterr().out


def test_bad_environment_number_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUCOST_SIM_GPUS", "many")
    with pytest.raises(SystemExit) as exit_:
        main(["run"])
    assert exit_.value.code == 2 and "invalid int value: 'many'" in capsys.readouterr().err


def test_json_schemas_cover_every_kind_with_its_wire_fields(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from gpucost.schemas.events import EVENT_MODELS
    from gpucost.schemas.records import OUTPUT_KINDS

    assert main(["topics", "schemas", "--schemas-out", str(tmp_path)]) == 0
    for group, models in (("event", EVENT_MODELS), ("record", OUTPUT_KINDS)):
        for name in models:
            schema = json.loads((tmp_path / f"{group}.{name}.schema.json").read_text())
            assert schema["type"] == "object"
    gpu = json.loads((tmp_path / "event.gpu_sample.schema.json").read_text())
    assert {"gpu_uuid", "ts_ns", "interval_s", "sm_util_pct"} <= set(gpu["required"])
    assert gpu["properties"]["sm_util_pct"]["maximum"] == 100
    trace = json.loads((tmp_path / "event.ebpf_trace.schema.json").read_text())
    assert (
        trace["required"] == ["kind", "node_id", "trace_hex"] and "{80}" in trace["properties"]["trace_hex"]["pattern"]
    )


def test_produce_checks_its_input_before_connecting(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # an unreachable broker: the missing input must be reported first, at once
    rc, _, err = cli(capsys, "produce", "--source", "replay", str(tmp_path / "nope"), "--bootstrap", "127.0.0.1:1")
    assert rc == 2 and "nope" in err and "does not exist" in err


def test_run_with_nvml_and_no_driver_is_one_clear_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, _, err = cli(capsys, "run", "--source", "nvml", "--out", str(tmp_path / "o"))
    assert rc == 2 and err.count("\n") == 1 and "NVML is not available" in err and "--source simulate" in err
    assert not (tmp_path / "o").exists()


def test_dead_letters_can_be_fixed_and_replayed(
    capsys: pytest.CaptureFixture[str], events: Path, tmp_path: Path
) -> None:
    """The documented recipe: export a reason's raw lines, fix them, replay them with the input."""
    good = next(events.glob("*.jsonl")).read_text().splitlines()
    sample = json.loads(next(line for line in good if '"gpu_sample"' in line))
    first_ts = sample["ts_ns"]
    broken = [
        json.dumps({**sample, "gpu_uuid": f"GPU-fix-{i}", "sm_util_pct": 140 + i, "ts_ns": first_ts + i})
        for i in range(3)
    ]
    (tmp_path / "broken.jsonl").write_text("\n".join(broken) + "\n")
    assert main(["replay", str(events), str(tmp_path / "broken.jsonl"), "--out", str(tmp_path / "a")]) == 0
    capsys.readouterr()
    rc, out, _ = cli(
        capsys,
        "query",
        "--out",
        str(tmp_path / "a"),
        "--format",
        "lines",
        "SELECT raw FROM dlq WHERE reason = 'out_of_range' ORDER BY raw",
    )
    assert rc == 0 and out.splitlines() == sorted(broken)
    fixed = [json.dumps({**json.loads(line), "sm_util_pct": 100.0}) for line in out.splitlines()]
    (tmp_path / "fixed.jsonl").write_text("\n".join(fixed) + "\n")
    assert main(["replay", str(events), str(tmp_path / "fixed.jsonl"), "--out", str(tmp_path / "b")]) == 0
    con = connect(tmp_path / "b")
    assert con.execute("SELECT count(*) FROM dlq").fetchone() == (0,)
    assert con.execute(
        "SELECT count(DISTINCT gpu_uuid) FROM idle_index WHERE gpu_uuid LIKE 'GPU-fix-%'"
    ).fetchone() == (3,)
    rc, _, err = cli(capsys, "query", "--out", str(tmp_path / "b"), "--format", "lines", "SELECT 1, 2")
    assert rc == 2 and "one column" in err


def test_what_a_new_user_tripped_over(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """views of a directory that is not there, --out naming a file, help that offers what does nothing."""
    rc, out, err = cli(capsys, "views", "--out", str(tmp_path / "nowhere"))
    assert rc == 2 and "does not exist" in err and not out
    (tmp_path / "a-file").write_text("x")
    rc, _, err = cli(capsys, "replay", str(tmp_path / "a-file"), "--out", str(tmp_path / "a-file"))
    assert rc == 2 and "is a file, not a directory" in err
    for command, offered in (("worker", False), ("run", True), ("replay", True)):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert ("--overwrite" in capsys.readouterr().out) == offered, command
    with pytest.raises(SystemExit):
        main(["sink", "--help"])
    assert "file flushes (default 2)" in " ".join(capsys.readouterr().out.split())


def test_output_cut_short_by_its_reader_is_no_error(tmp_path: Path) -> None:
    """`gpucost query … | head -1` ended in a BrokenPipeError traceback."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    (tmp_path / "out" / "cost").mkdir(parents=True)  # an output as a sink leaves it before its first file
    piped = subprocess.run(
        f"{sys.executable} -m gpucost.cli query --out {tmp_path / 'out'} --format csv "
        "'SELECT * FROM range(3000000)' | head -1",
        shell=True,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert piped.stdout == "range\n" and "Traceback" not in piped.stderr and "Error" not in piped.stderr, piped.stderr


def test_an_earlier_output_inside_the_input_is_not_replayed(
    capsys: pytest.CaptureFixture[str], events: Path, tmp_path: Path
) -> None:
    """An earlier run's --out under the input directory was read as events: 178 unknown_kind dead letters."""
    import shutil

    mixed = tmp_path / "in"
    shutil.copytree(events, mixed)
    assert cli(capsys, "replay", str(mixed), "--out", str(mixed / "old-out"))[0] == 0
    assert cli(capsys, "replay", str(mixed), "--out", str(tmp_path / "again"))[0] == 0
    assert cli(capsys, "replay", str(events), "--out", str(tmp_path / "alone"))[0] == 0
    for view in ("cost", "idle_index", "mae", "dlq"):
        sql = f"SELECT * EXCLUDE (date) FROM {view} ORDER BY ALL"
        assert (
            connect(tmp_path / "again").execute(sql).fetchall() == connect(tmp_path / "alone").execute(sql).fetchall()
        )


def test_simulate_refuses_to_add_a_second_fleet_to_a_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """JSON then Parquet into one folder left both, and a replay of it gave 708 dead letters."""
    assert cli(capsys, "simulate", *SMALL, "--out", str(tmp_path))[0] == 0
    rc, _, err = cli(capsys, "simulate", *SMALL, "--format", "parquet", "--out", str(tmp_path))
    assert rc == 2 and "already holds simulated events" in err and "--overwrite" in err
    assert cli(capsys, "simulate", *SMALL, "--format", "parquet", "--out", str(tmp_path), "--overwrite")[0] == 0
    assert {p.suffix for p in tmp_path.iterdir()} == {".parquet"}


def test_a_table_shows_null_as_null(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "o" / "cost").mkdir(parents=True)
    rc, out, _ = cli(capsys, "query", "--out", str(tmp_path / "o"), "SELECT NULL AS a, '' AS b")
    assert rc == 0 and out.splitlines()[2].split() == ["NULL"]


def test_run_shows_its_progress_on_a_terminal(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """As replay does: events taken so far, on stderr, only when stderr is a terminal."""
    import re

    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    rc, out, err = cli(capsys, "run", *SMALL, "--out", str(tmp_path / "o"))
    shown = re.findall(r"run: ([\d.]+)(k?) events", err)
    (processed,) = re.findall(r"processed ([\d,]+) inputs", out)
    value, kilo = shown[-1]
    assert rc == 0 and float(value) * (1000 if kilo else 1) == pytest.approx(int(processed.replace(",", "")), rel=5e-3)
    monkeypatch.setattr("sys.stderr.isatty", lambda: False)
    assert "events/s" not in cli(capsys, "run", *SMALL, "--out", str(tmp_path / "p"))[2]
