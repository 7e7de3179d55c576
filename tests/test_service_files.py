"""The service files of a continuous `gpucost run` (compose/systemd/ and compose's `gpucost-run`), checked
without systemd or Docker running: the unit's command is one the CLI accepts and resumes rather than
overwrites, its output lies where the unit may write, it restarts, stops with time to publish, and keeps
NVML's devices; the env file sets only variables `gpucost run` reads; `systemd-analyze verify` (where
installed) accepts the units; and the health probe tells a healthy run from a failing one."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest
import yaml

from gpucost.cli import build_parser, command_flags
from gpucost.config import AUDIT_ENV_PREFIX, FLAG_FIELDS
from gpucost.metrics import Health, MetricsServer
from tests.conftest import ROOT

SYSTEMD = ROOT / "compose" / "systemd"
UNIT, HEALTHZ, TIMER = "gpucost-run.service", "gpucost-run-healthz.service", "gpucost-run-healthz.timer"
EBPF = Path(f"{UNIT}.d") / "ebpf.conf"


def unit(name: str | Path) -> dict[str, list[tuple[str, str]]]:
    """A unit file's sections, each its (key, value) lines in order: a key may repeat (ExecStart= to reset)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    text = re.sub(r"\\\n", " ", (SYSTEMD / name).read_text())  # continued lines
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = sections.setdefault(line.strip("[]"), [])
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{name}: not KEY=VALUE: {line!r}"
        section.append((key.strip(), value.strip()))
    return sections


def values(section: list[tuple[str, str]], key: str) -> list[str]:
    """A key's values as systemd reads them: an empty assignment drops those before it."""
    found: list[str] = []
    for k, v in section:
        if k == key:
            found = [] if v == "" else [*found, v]
    return found


def one(section: list[tuple[str, str]], key: str) -> str:
    (value,) = values(section, key)
    return value


def gpucost_argv(service: list[tuple[str, str]]) -> list[str]:
    argv = shlex.split(one(service, "ExecStart"))
    assert PurePosixPath(argv[0]).name == "gpucost" and PurePosixPath(argv[0]).is_absolute()
    return argv[1:]


def run_env_names() -> set[str]:
    """Every environment variable `gpucost run` reads, from the code: each flag's help names its variable
    (``flags.env_flag`` and the others write "env NAME"), and the audit settings are GPUCOST_<FIELD>."""
    helps = " ".join(a.help or "" for a in command_flags("run"))
    return set(re.findall(r"env (\w+)", helps)) | {AUDIT_ENV_PREFIX + f.upper() for f in FLAG_FIELDS}


def flag_of(env: str) -> str:
    """The `gpucost run` flag whose help names ``env`` (or the audit setting's flag)."""
    for action in command_flags("run"):
        if re.search(rf"env {env}\b", action.help or ""):
            return action.option_strings[0]
    return "--" + env.removeprefix(AUDIT_ENV_PREFIX).lower().replace("_", "-")


def env_file() -> dict[str, bool]:
    """The env file's variables, each with whether it is set (True) or only shown commented out (False)."""
    found = re.findall(r"^(#?)\s*([A-Z][A-Z0-9_]*)=", (SYSTEMD / "gpucost-run.env").read_text(), re.M)
    return {name: not hashed for hashed, name in found}


def test_the_unit_runs_a_gpucost_run_that_resumes_into_its_state_directory() -> None:
    service = unit(UNIT)["Service"]
    argv = gpucost_argv(service)
    args = build_parser().parse_args(argv)  # exits (fails the test) on a command the CLI refuses
    assert args.command == "run" and args.source == "nvml"  # not auto: a node without NVML must not simulate
    assert "--overwrite" not in argv and not args.overwrite  # a restart resumes; --overwrite would start afresh
    writable = [PurePosixPath("/var/lib") / d for d in " ".join(values(service, "StateDirectory")).split()]
    writable += [PurePosixPath(p.lstrip("-")) for p in " ".join(values(service, "ReadWritePaths")).split()]
    out = PurePosixPath(str(args.out))
    assert out.is_absolute() and any(out == w or w in out.parents for w in writable), (out, writable)
    assert one(service, "Type") == "simple"  # gpucost does not call sd_notify
    assert one(service, "Restart") in ("always", "on-failure") and one(service, "RestartSec")


def test_the_unit_stops_with_time_to_publish_and_keeps_nvml_and_its_own_user() -> None:
    service = unit(UNIT)["Service"]
    assert one(service, "KillSignal") == "SIGTERM"  # the first ends the source cleanly (wiring.Signals)
    assert one(service, "KillMode") == "mixed"  # only the run is signalled; it stops its bpftrace itself
    stop = re.fullmatch(r"(\d+)(s|min)", one(service, "TimeoutStopSec"))
    assert stop and int(stop[1]) * (60 if stop[2] == "min" else 1) >= 60
    assert one(service, "User") not in ("root", "0") and one(service, "User") == one(service, "Group")
    assert re.search(
        rf"^u {one(service, 'User')} .* /var/lib/{one(service, 'StateDirectory')} ",
        (SYSTEMD / "gpucost.sysusers.conf").read_text(),
        re.M,
    )  # its home: the state directory
    assert values(service, "PrivateDevices") in ([], ["no"])  # would hide /dev/nvidia*
    assert values(service, "ProtectProc") in ([], ["default"])  # NVML's pids are looked up in /proc
    assert values(service, "DevicePolicy") in ([], ["auto"]) or any(
        "nvidia" in d for d in values(service, "DeviceAllow")
    )
    assert one(service, "NoNewPrivileges") == "yes" and one(service, "ProtectSystem") == "strict"
    # reading other users' process environments (--attribution environ, the default) takes CAP_SYS_PTRACE
    assert values(service, "AmbientCapabilities") == ["CAP_SYS_PTRACE"]
    assert one(unit(UNIT)["Install"], "WantedBy") == "multi-user.target"


def test_the_ebpf_drop_in_runs_the_same_output_as_root() -> None:
    base, ebpf = unit(UNIT)["Service"], unit(EBPF)["Service"]
    assert [v for k, v in ebpf if k == "ExecStart"][0] == ""  # a drop-in must reset ExecStart= to replace it
    args = build_parser().parse_args(gpucost_argv(ebpf))
    assert args.source == "ebpf" and not args.overwrite
    assert args.out == build_parser().parse_args(gpucost_argv(base)).out
    assert one(ebpf, "User") == "root"  # producers/ebpf.py refuses any other user
    assert values(ebpf, "AmbientCapabilities") == [] and values(ebpf, "CapabilityBoundingSet") == ["~"]


@pytest.mark.slow
def test_the_env_file_sets_only_what_gpucost_run_reads() -> None:
    names, read = env_file(), run_env_names()
    assert "GPUCOST_METRICS_ADDRESS" in read and "GPUCOST_PANE_S" in read  # the derivation finds both kinds
    assert names and {n for n, is_set in names.items() if is_set} <= read, set(names) - read
    assert set(names) <= read, set(names) - read
    assert "GPUCOST_PUBLISH_DELAY_S" in {n for n, is_set in names.items() if is_set}  # the crash loss, said
    given = set(gpucost_argv(unit(UNIT)["Service"]))
    assert not {n for n in names if n in read and flag_of(n) in given}  # the command line would outrank it


def test_the_health_check_asks_the_runs_own_address_and_restarts_only_a_running_run() -> None:
    run, check = unit(UNIT)["Service"], unit(HEALTHZ)["Service"]
    assert values(check, "EnvironmentFile") == values(run, "EnvironmentFile")
    assert values(check, "Environment") == values(run, "Environment")
    assert any(v.startswith("GPUCOST_METRICS_ADDRESS=") for v in values(run, "Environment"))
    assert env_file().get("GPUCOST_METRICS_ADDRESS")
    assert one(check, "Type") == "oneshot" and one(check, "ExecStart").endswith("/gpucost-healthz.py")
    assert one(check, "ExecCondition").endswith(f"is-active --quiet {UNIT}")
    # try-restart: a run stopped on purpose stays stopped; $$ reaches the shell as $ (systemd's escape)
    assert f"systemctl try-restart --no-block {UNIT}" in one(check, "ExecStopPost")
    assert '"$$SERVICE_RESULT" = success ||' in one(check, "ExecStopPost")
    timer = unit(TIMER)
    assert values(timer["Timer"], "Unit") in ([], [HEALTHZ]) and values(timer["Timer"], "OnUnitActiveSec")
    assert one(timer["Install"], "WantedBy") == "timers.target"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize("with_ebpf", [False, True])
def test_systemd_analyze_verify_accepts_the_units(tmp_path: Path, with_ebpf: bool) -> None:
    """The installed paths become this environment's (systemd checks that each command is executable);
    a warning about any of the units (an unknown key, a value it cannot parse) fails the test."""
    bin_dir = Path(sys.executable).parent
    for name in (UNIT, HEALTHZ, TIMER, *([EBPF] if with_ebpf else [])):
        text = (SYSTEMD / name).read_text().replace("/opt/gpucost/bin/", f"{bin_dir}/")
        text = text.replace("/usr/local/libexec/gpucost-healthz.py", str(SYSTEMD / "gpucost-healthz.py"))
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", UNIT, HEALTHZ, TIMER],
        capture_output=True,
        text=True,
        env={"SYSTEMD_UNIT_PATH": f"{tmp_path}:", "PATH": "/usr/bin:/bin"},
    )
    ours = [line for line in (done.stdout + done.stderr).splitlines() if "gpucost" in line]
    assert done.returncode == 0 and not ours, done.stdout + done.stderr


def probe(address: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SYSTEMD / "gpucost-healthz.py"), *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={"GPUCOST_METRICS_ADDRESS": address, "PATH": "/usr/bin:/bin"},
        cwd=ROOT,
    )


def test_the_probe_passes_a_healthy_run_and_fails_a_stalled_or_absent_one() -> None:
    health = Health()
    server = MetricsServer("127.0.0.1:0", list, health)
    try:
        assert probe(f"127.0.0.1:{server.port}").returncode == 0
        assert probe(f"0.0.0.0:{server.port}").returncode == 0  # every interface: asked on the loopback
        health.failure = "the main loop has not run for 75 s"
        failed = probe(f"127.0.0.1:{server.port}", "1")
        assert failed.returncode == 1 and "503: the main loop has not run for 75 s" in failed.stderr
    finally:
        server.close()
    gone = probe(f"127.0.0.1:{server.port}", "1")  # nothing listens: refused
    assert gone.returncode == 1 and "attempt 1 of 1" in gone.stderr
    assert probe("", "1").returncode == 1 and probe("nonsense", "1").returncode == 1


COMPOSE = yaml.safe_load((ROOT / "compose" / "docker-compose.yml").read_text())


def test_the_compose_service_runs_continuously_into_a_volume_with_its_health_checked() -> None:
    """tests/test_compose.py parses its command with the CLI and checks its mount point in the image."""
    service = COMPOSE["services"]["gpucost-run"]
    args = build_parser().parse_args(service["command"])
    assert args.command == "run" and args.source == "nvml" and "--overwrite" not in service["command"]
    assert service["restart"] == "unless-stopped" and service["depends_on"] == []  # no broker needed
    (volume,) = service["volumes"]
    name, target = volume.split(":")[:2]
    assert name in COMPOSE["volumes"] and PurePosixPath(target) in PurePosixPath(str(args.out)).parents
    port = service["environment"]["GPUCOST_METRICS_ADDRESS"].rpartition(":")[2]
    test = service["healthcheck"]["test"]
    assert test[:2] == ["CMD", "python"] and f"'http://127.0.0.1:{port}/healthz'" in test[-1]  # no curl in the image
    assert "curl" not in (ROOT / "compose" / "Dockerfile").read_text()
    grace = re.fullmatch(r"(\d+)(s|m)", service["stop_grace_period"])
    assert grace and int(grace[1]) * (60 if grace[2] == "m" else 1) >= 60  # Docker's default 10 s cuts the publish
    (device,) = service["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "utility" in device["capabilities"]
    assert service["environment"]["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert service["pid"] == "host"  # NVML's pids are the node's
