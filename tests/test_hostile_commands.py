"""Hostile input to the commands users run (issue 35, items 12 and 13).

Bad text as cheap as good text: a batch of lines Arrow's JSON reader refuses (lone surrogate
escapes, wrong types, torn lines) is counted in Arrow reads and Python decodes, which must not grow
with the number of bad lines, and each line is dead-lettered exactly as the row path does it.

No command ends in a traceback or a false success: each command with a hostile argument (an output
path it cannot write, an --out holding no gpucost output, a file nested 100,000 deep, binary or
empty) exits non-zero with one line ``gpucost: error: …`` naming the argument, prints nothing on
stdout, and leaves no file at or beside the target. The commands that read pipeline output read a
tiny replay made in both configurations of the ``horizon`` fixture.
"""

from __future__ import annotations

import errno
import os
import traceback
from collections.abc import Callable, Iterator
from contextlib import redirect_stderr, redirect_stdout
from io import StringIO
from pathlib import Path

import pyarrow
import pyarrow.json
import pytest

from gpucost.cli import main
from gpucost.schemas import codec
from gpucost.schemas.blocks import expand
from gpucost.schemas.records import DeadLetter
from gpucost.sinks.views import connect
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings
from tests.conftest import HOSTILE_LINES, horizon_label

# ------------------------------------------------------------------ item 12: bad text as cheap as good text

T0 = 1_700_000_000 * 10**9
SURROGATES = "\\ud800" * 40  # 240 characters of lone high-surrogate escapes, as JSON text


def _sample(i: int, node: str = "node-0", gpu: str = "GPU-0", model: str = "H100") -> str:
    return (
        f'{{"kind":"gpu_sample","node_id":"{node}","gpu_uuid":"{gpu}","ts_ns":{T0 + i * 10**9},'
        f'"interval_s":1.0,"sm_util_pct":50,"mem_bw_util_pct":10,"mem_used_bytes":1,"gpu_model":"{model}",'
        f'"mem_total_bytes":100,"power_w":300,"temp_c":50}}'
    )


def _binding(i: int, team: str) -> str:
    return (
        f'{{"kind":"tenant_binding","node_id":"node-0","pid":{i},"ts_ns":{T0 + i},"team":"{team}",'
        f'"env":"prod","app":"a","tier":"t","sla":"Gold"}}'
    )


def _process(i: int, node: str = "node-0", pid: str = "7") -> str:
    return (
        f'{{"kind":"process_sample","node_id":"{node}","gpu_uuid":"GPU-0","pid":{pid},"ts_ns":{T0 + i * 10**9},'
        f'"interval_s":1.0,"sm_util_pct":50,"mem_bw_util_pct":10,"mem_used_bytes":1}}'
    )


#: what each attack sends as line ``i`` of a batch
BAD_LINES: dict[str, Callable[[int], str]] = {
    "lone surrogates in a binding's team": lambda i: _binding(i, SURROGATES),
    "lone surrogates in every string of a sample": lambda i: _sample(
        i, "\\udc00" * 8, SURROGATES, "\\ud800\\udfff\\ud800"
    ),
    "one lone surrogate in a gpu_uuid": lambda i: _sample(i, gpu="GPU-\\ud800"),
    "a low surrogate alone in a node_id": lambda i: _process(i, node="n\\udc00"),
    "a pid as a string (wrong type)": lambda i: _process(i, pid='"7"'),
    "torn lines": lambda i: _sample(i)[:-12],
    "one surrogate line in 16, the rest good": lambda i: _sample(i, gpu="GPU-\\ud800" if i % 16 == 0 else "GPU-0"),
}
LINES = 1024  # over FEW_LINES (128) and the 200 a Kafka poll brings: the batch path
#: Arrow reads a batch may cost whatever it holds; halving to every bad line cost 2 × LINES - 1
MAX_READS = 32


@pytest.mark.parametrize("attack", BAD_LINES)
def test_bad_text_costs_what_good_text_costs(
    attack: str, horizon: AuditSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = [BAD_LINES[attack](i).encode() for i in range(LINES)]
    reads, refused, decodes = _counted(monkeypatch)
    batch = Auditor(horizon)
    letters = [o for o in expand(batch.ingest_lines(lines, lambda i: f"line {i}")) if isinstance(o, DeadLetter)]
    work = (reads[0], decodes[0], refused[0])
    monkeypatch.undo()
    row = Auditor(horizon)  # the row path, one line at a time: the dead letters as they always were
    want = [o for i, line in enumerate(lines) for o in row.ingest(line, f"line {i}") if isinstance(o, DeadLetter)]
    HOSTILE_LINES.append(
        f"{attack:<44} sent {LINES:>6,} | refused {len(letters):>5,} "
        f"{sorted({d.reason for d in letters})} | Arrow reads {work[0]} (≤ {MAX_READS}, {work[2]} refused), "
        f"Python decodes {work[1]:,} (≤ {2 * LINES:,}) {horizon_label(horizon)}"
    )
    assert [(d.reason, d.detail, d.kind, d.raw, d.source) for d in letters] == [
        (d.reason, d.detail, d.kind, d.raw, d.source) for d in want
    ]
    assert letters and batch.counts == row.counts
    assert work[0] <= MAX_READS, f"{work[0]} Arrow reads for {LINES} lines: the work grows with the bad lines"
    assert work[1] <= 2 * LINES, f"{work[1]} Python decodes for {LINES} lines"
    if "surrogate" in attack:  # seen in the text, decided by Python: not one read spent on them
        assert work[2] == 0, f"{work[2]} Arrow reads refused lines with surrogate escapes"


def _counted(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[int], list[int]]:
    """Counters of Arrow's JSON reads, of those it refused, and of Python's decodes of an object into an
    event, while patched."""
    reads, refused, decodes = [0], [0], [0]
    read_json, decode_object = pyarrow.json.read_json, codec.decode_object

    def counted_read(*args: object, **kwargs: object) -> object:
        reads[0] += 1
        try:
            return read_json(*args, **kwargs)
        except pyarrow.ArrowException:
            refused[0] += 1
            raise

    def counted_decode(obj: object) -> object:
        decodes[0] += 1
        return decode_object(obj)

    monkeypatch.setattr(pyarrow.json, "read_json", counted_read)
    monkeypatch.setattr(codec, "decode_object", counted_decode)
    return reads, refused, decodes


# ------------------------------------------------------------------ item 13: no traceback, no false success

PROC = "/proc/gpucost-hostile"  # a path no one may create a file at, root included
SIGNING_KEY = f"prices {(b'p' * 32).hex()} @prices\n"


def _hostile_files(tmp: Path) -> None:
    """What the cases point at, made fresh in each test's folder."""
    (tmp / "dir").mkdir()
    (tmp / "file.txt").write_text("not a folder\n")
    (tmp / "foreign").mkdir()
    (tmp / "foreign" / "notes.txt").write_text("no gpucost output here\n")
    (tmp / "emptydir").mkdir()
    (tmp / "empty.jsonl").write_bytes(b"")
    (tmp / "binary.bin").write_bytes(bytes(range(256)) * 16)
    (tmp / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp / "deep-object.json").write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    (tmp / "deep-otlp.json").write_text('{"resourceMetrics":' + "[" * 100_000 + "]" * 100_000 + "}")
    (tmp / "deep.toml").write_text("a = " + "[" * 100_000 + "]" * 100_000 + "\n")
    (tmp / "prices.key").write_text(SIGNING_KEY)


#: (what is attacked, the command line, what the one error line must name); {tmp} is the test's folder,
#: {events} simulated events, {out} a replay's output, {gpu} one of its GPUs, {dlq} an output of dead letters only
FILE_TARGETS = {
    "a missing folder": "{tmp}/missing/x",
    "a path under a file": "{tmp}/file.txt/x",
    "a directory": "{tmp}/dir",
    "an unwritable place": PROC,
}
FOLDER_TARGETS = {"a file": "{tmp}/file.txt", "a path under a file": "{tmp}/file.txt/x", "an unwritable place": PROC}
WRITES_FROM_OUTPUT = {
    "report --html": ["report", "--out", "{out}", "--html"],
    "health snapshot --file": ["health", "snapshot", "--gpu", "{gpu}", "--out", "{out}", "--file"],
    "health export-otlp --json": ["health", "export-otlp", "--out", "{out}", "--json"],
    "discovery --file-sd": ["discovery", "--out", "{out}", "--file-sd"],
    "export focus FILE": ["export", "focus", "--month", "2025-01", "--out", "{out}", "--format", "csv"],
    "reclaim --actions-file": ["reclaim", "--out", "{out}", "--actions-file"],
}
EMPTY_OUT = {"a folder of other files": "{tmp}/foreign", "an empty folder": "{tmp}/emptydir"}
READS_OUTPUT = {
    "whatif --out": ["whatif", "--out"],
    "report --out": ["report", "--html", "{tmp}/r.html", "--out"],
    "views --out": ["views", "--out"],
    "health export-otlp --out": ["health", "export-otlp", "--json", "{tmp}/o.json", "--out"],
    "query --out": ["query", "SELECT 1", "--out"],
    "export focus --out": ["export", "focus", "{tmp}/f.csv", "--month", "2025-01", "--out"],
    "reclaim --out": ["reclaim", "--dry-run", "--out"],
}
OUTPUT_CASES = [
    *(
        (f"{cmd} {where}", [*argv, path], path)
        for cmd, argv in WRITES_FROM_OUTPUT.items()
        for where, path in FILE_TARGETS.items()
    ),
    *(
        (f"{cmd} {where}", [*argv, path], path)
        for cmd, argv in READS_OUTPUT.items()
        for where, path in EMPTY_OUT.items()
    ),
    ("whatif --out of dead letters only", ["whatif", "--out", "{dlq}"], "{dlq}"),
    ("whatif --prices a 0-byte file", ["whatif", "--out", "{out}", "--prices", "{tmp}/empty.jsonl"], "empty.jsonl"),
    (
        "export focus of a month without cost",
        ["export", "focus", "{tmp}/f.csv", "--month", "1999-01", "--out", "{out}"],
        "1999-01",
    ),
]
CASES = [
    *(
        (f"fit-weights --write {where}", ["fit-weights", "{events}", "--write", path], path)
        for where, path in FILE_TARGETS.items()
    ),
    *(
        (f"simulate --out {where}", ["simulate", "--gpus", "1", "--hours", "0.01", "--out", path], path)
        for where, path in FOLDER_TARGETS.items()
    ),
    *(
        (f"topics schemas --schemas-out {where}", ["topics", "schemas", "--schemas-out", path], path)
        for where, path in FOLDER_TARGETS.items()
    ),
    ("health verify JSON 100,000 arrays deep", ["health", "verify", "{tmp}/deep.json"], "deep.json"),
    ("health verify JSON 100,000 objects deep", ["health", "verify", "{tmp}/deep-object.json"], "deep-object.json"),
    ("health verify OTLP JSON 100,000 deep", ["health", "verify", "{tmp}/deep-otlp.json"], "deep-otlp.json"),
    (
        "health verify --key-file binary",
        ["health", "verify", "{tmp}/deep.json", "--key-file", "{tmp}/binary.bin"],
        "binary.bin",
    ),
    ("fit-weights --config TOML 100,000 deep", ["fit-weights", "{events}", "--config", "{tmp}/deep.toml"], "deep.toml"),
    ("fit-weights --config binary", ["fit-weights", "{events}", "--config", "{tmp}/binary.bin"], "binary.bin"),
    (
        "replay --audit-key-file binary",
        ["replay", "{events}", "--out", "{tmp}/r", "--audit-key-file", "{tmp}/binary.bin"],
        "binary.bin",
    ),
    (
        "run --audit-key-file 0-byte",
        [
            "run",
            "--source",
            "simulate",
            "--gpus",
            "1",
            "--hours",
            "0.01",
            "--out",
            "{tmp}/r",
            "--audit-key-file",
            "{tmp}/empty.jsonl",
        ],
        "empty.jsonl",
    ),
    (
        "prices sign --signing-key-file binary",
        ["prices", "sign", "{events}", "--signing-key-file", "{tmp}/binary.bin"],
        "binary.bin",
    ),
    (
        "prices sign a 0-byte file",
        ["prices", "sign", "{tmp}/empty.jsonl", "--signing-key-file", "{tmp}/prices.key"],
        "empty.jsonl",
    ),
]


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("events")
    assert main(["simulate", "--gpus", "2", "--hours", "0.5", "--out", str(path)]) == 0
    return path


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory, events: Path) -> Iterator[Callable[[AuditSettings], Path]]:
    """A replay's output, and one of dead letters only, made once per configuration (the horizon fixture's
    environment is in force when they are made)."""
    made: dict[str, Path] = {}

    def output(settings: AuditSettings) -> Path:
        label = horizon_label(settings)
        if label not in made:
            root = tmp_path_factory.mktemp(f"out-{label}")
            (root / "bad.jsonl").write_text('{"kind":"gpu_sample"}\nnot json\n')
            with redirect_stdout(StringIO()):
                assert main(["replay", str(events), "--out", str(root / "out")]) == 0
                assert main(["replay", str(root / "bad.jsonl"), "--out", str(root / "dlq")]) == 0
            made[label] = root
        return made[label]

    yield output


@pytest.mark.parametrize("attack,argv,named", OUTPUT_CASES, ids=[c[0] for c in OUTPUT_CASES])
def test_a_command_reading_output_refuses_a_hostile_argument(
    attack: str,
    argv: list[str],
    named: str,
    tmp_path: Path,
    horizon: AuditSettings,
    events: Path,
    outputs: Callable[[AuditSettings], Path],
) -> None:
    root = outputs(horizon)
    (gpu,) = connect(root / "out").execute("SELECT min(gpu_uuid) FROM health").fetchone()  # type: ignore[misc]
    _refused(
        attack,
        argv,
        named,
        tmp_path,
        horizon_label(horizon),
        events=events,
        out=root / "out",
        dlq=root / "dlq",
        gpu=gpu,
    )


@pytest.mark.parametrize("attack,argv,named", CASES, ids=[c[0] for c in CASES])
def test_a_command_refuses_a_hostile_argument(
    attack: str, argv: list[str], named: str, tmp_path: Path, events: Path
) -> None:
    _refused(attack, argv, named, tmp_path, "", events=events)


def _refused(attack: str, argv: list[str], named: str, tmp: Path, label: str, **paths: object) -> None:
    """``argv`` (its {names} filled in) ends in one error line naming ``named``, and writes nothing."""
    _hostile_files(tmp)
    fill = {"tmp": tmp, **paths}
    argv = [a.format(**fill) for a in argv]
    watched = [tmp, *(p for p in paths.values() if isinstance(p, Path))]
    before = _tree(watched)
    rc, out, err = _cli(argv)
    said = err.strip()
    for name, path in sorted(fill.items(), key=lambda kv: -len(str(kv[1]))):  # the longest first: {out} in {tmp}
        said = said.replace(str(path), f"{{{name}}}") if isinstance(path, Path) else said
    HOSTILE_LINES.append(f"{attack:<48} {label:>5} | exit {rc} | {said[:120]}")
    assert "Traceback" not in err, err
    assert rc != 0 and not out, f"a false success: exit {rc}, stdout {out[:200]!r}"
    assert err.count("\n") == 1 and err.startswith("gpucost: error: "), err
    assert named.format(**fill) in err, f"the error does not name {named}: {err}"
    assert _tree(watched) == before, f"files left: {_tree(watched) ^ before}"
    assert not os.path.exists(PROC)


def _cli(argv: list[str]) -> tuple[int, str, str]:
    """``gpucost`` in this process: its exit status, stdout and stderr (an uncaught exception as the traceback
    Python would print)."""
    out, err = StringIO(), StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
        except Exception:  # what a user would see as a traceback
            err.write(traceback.format_exc())
            rc = 1
    return rc, out.getvalue(), err.getvalue()


def _tree(roots: list[Path]) -> set[str]:
    return {str(p) for root in roots for p in root.rglob("*")}


#: the commands that write a file (or files), each pointed at one that holds "old" (simulate: at a new folder)
DISK_FULL = {
    "report --html": ["report", "--out", "{out}", "--html", "{tmp}/old"],
    "fit-weights --write": ["fit-weights", "{events}", "--write", "{tmp}/old"],
    "health snapshot --file": ["health", "snapshot", "--gpu", "{gpu}", "--out", "{out}", "--file", "{tmp}/old"],
    "health export-otlp --json": ["health", "export-otlp", "--out", "{out}", "--json", "{tmp}/old"],
    "discovery --file-sd": ["discovery", "--out", "{out}", "--file-sd", "{tmp}/old"],
    "simulate --out": ["simulate", "--gpus", "1", "--hours", "0.01", "--out", "{tmp}/sim"],
}


@pytest.mark.parametrize("command", DISK_FULL)
def test_a_disk_that_fills_half_way_leaves_the_old_file(
    command: str,
    tmp_path: Path,
    horizon: AuditSettings,
    events: Path,
    outputs: Callable[[AuditSettings], Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every write stops half-way with ENOSPC: the target keeps what it held, nothing is left beside it."""
    root = outputs(horizon)
    (gpu,) = connect(root / "out").execute("SELECT min(gpu_uuid) FROM health").fetchone()  # type: ignore[misc]
    (tmp_path / "old").write_text("old\n")
    fill = {"tmp": tmp_path, "events": events, "out": root / "out", "gpu": gpu}
    argv = [a.format(**fill) for a in DISK_FULL[command]]

    def half_then_full(path: Path, data: str | bytes, *args: object, **kwargs: object) -> None:
        raw = data.encode() if isinstance(data, str) else data
        with open(path, "wb") as fh:
            fh.write(raw[: len(raw) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(Path, "write_text", half_then_full)
    monkeypatch.setattr(Path, "write_bytes", half_then_full)
    rc, _, err = _cli(argv)
    monkeypatch.undo()
    said = err.strip().replace(str(tmp_path), "{tmp}")
    HOSTILE_LINES.append(
        f"{command + ' with the disk full half-way':<48} {horizon_label(horizon):>5} | exit {rc} | {said[:120]}"
    )
    assert "Traceback" not in err, err
    assert rc != 0 and err.count("\n") == 1 and err.startswith("gpucost: error: ") and "No space left" in err, err
    assert (tmp_path / "old").read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["old"]
