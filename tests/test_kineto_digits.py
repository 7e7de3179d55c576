"""A Kineto trace with a number of more digits than Python turns into an int (4,300 by default) is refused with a
line that says so, where ijson's C backend had killed the process (SIGSEGV): ``producers/kineto.DigitGuard``."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys

import pytest

from gpucost.producers.kineto import DigitGuard

LIMIT = sys.get_int_max_str_digits()


def _trace(ts: str) -> bytes:
    return b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 1, "ts": %s, "dur": 1}]}' % (
        ts.encode()
    )


@pytest.mark.parametrize("gzipped", [False, True])
def test_a_number_too_long_for_python_is_one_line_not_a_crash(tmp_path, gzipped):
    data = _trace("9" * (LIMIT + 700))
    path = tmp_path / ("t.json.gz" if gzipped else "t.json")
    path.write_bytes(gzip.compress(data) if gzipped else data)
    run = subprocess.run(
        [sys.executable, "-m", "gpucost.cli", "kernels", str(path)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 2, run.returncode  # -11 (SIGSEGV) before
    assert f"a run of {LIMIT:,} digits or more at byte {data.index(b'9'):,}" in run.stderr
    assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1


def test_a_number_one_digit_shorter_is_read_and_its_event_left_out(tmp_path):
    path = tmp_path / "t.json"
    path.write_bytes(_trace("9" * (LIMIT - 1)))
    run = subprocess.run(
        [sys.executable, "-m", "gpucost.cli", "kernels", str(path)], capture_output=True, text=True, timeout=120
    )
    report = json.loads(run.stdout)
    assert run.returncode == 0 and report["devices"] == []
    (reason,) = report["rejected"]  # left out by its reason, counted
    assert reason.startswith("t.json: kernel: start_ns: Input should be less than")


@pytest.mark.parametrize("size", [1, 7, 4096, 65536])
@pytest.mark.parametrize("run", [LIMIT - 1, LIMIT, LIMIT + 1])
def test_the_guard_sees_a_run_across_reads(size, run):
    """Digits split over many reads (reads of ``size`` bytes) are one run; a run one short of the limit passes."""
    data = b'[1, "x", ' + b"7" * run + b", 2]"
    guard = DigitGuard(io.BytesIO(data))
    out = b""
    try:
        while chunk := guard.read(size):
            out += chunk
    except ValueError as exc:
        assert run >= LIMIT and f"at byte {data.index(b'7'):,}" in str(exc)
    else:
        assert run < LIMIT and out == data


@pytest.mark.parametrize("bad_pass", [1, 2])
def test_each_pass_over_the_file_is_guarded(bad_pass):
    """The reader reads the file twice (header figures, then events); a file rewritten between the two (a trace
    still being written) is guarded in the second pass too: here the file's bytes are hostile in one pass only."""
    code = f"""
import contextlib, io
from pathlib import Path
from gpucost.producers import kineto
texts = [{_trace("5")!r}, {_trace("9" * (LIMIT + 1))!r}]
if {bad_pass} == 1:
    texts.reverse()
kineto.open_bytes = lambda path: contextlib.nullcontext(io.BytesIO(texts.pop(0)))
try:
    kineto.read_kineto(Path("t.json"))
except ValueError as e:
    print("refused", e)
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.startswith("refused a run of"), (run.returncode, run.stderr[-300:])


def _kernels(path, *flags: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "gpucost.cli", "kernels", str(path), *flags]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("ts", ["1e999990", "1e1000000", "-1e999990", "1e40"])
def test_a_short_number_of_a_huge_magnitude_is_one_event_left_out(tmp_path, ts):
    """``1e999990`` is nine characters that ``int`` would spend a minute turning into a million digits, and
    ``1e1000000`` overflows a decimal's arithmetic: each leaves its event out, counted, and the rest is read."""
    kernel = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 1, "dur": 2}
    events = [kernel | {"ts": "TS"}, kernel | {"ts": 5}]
    text = json.dumps({"baseTimeNanoseconds": 1_711_964_646_000_000_000, "traceEvents": events})
    path = tmp_path / "t.json"
    path.write_text(text.replace('"TS"', ts))
    run = _kernels(path)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert list(report["rejected"].values()) == [1]
    assert "is no id, count or time a trace holds" in next(iter(report["rejected"]))
    (device,) = report["devices"]
    assert device["busy_ns"] == 2000  # the other kernel is read


@pytest.mark.parametrize(
    ("header", "said"),
    [
        ('"baseTimeNanoseconds": 1e99999999, ', "is no id, count or time a trace holds"),
        ('"baseTimeNanoseconds": 1e99999999999999999999, ', "a number too large for any reader"),
    ],
)
def test_a_header_number_no_reader_holds_refuses_the_file_in_one_line(tmp_path, header, said):
    path = tmp_path / "t.json"
    path.write_bytes(b"{" + header.encode() + _trace("5")[1:])
    run = _kernels(path)
    assert run.returncode == 2 and said in run.stderr and "Traceback" not in run.stderr
    assert "cannot be read as a Kineto trace" in run.stderr
