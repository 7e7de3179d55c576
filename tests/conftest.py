from __future__ import annotations

import contextlib
import os
import random
import secrets
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, settings

if TYPE_CHECKING:
    from gpucost.streams.settings import AuditSettings

settings.register_profile(
    "ci", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.register_profile(
    "dev", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
# the inner loop (`pytest -q`) draws 40 examples per property; CI sets HYPOTHESIS_PROFILE=ci for 150
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

ROOT = Path(__file__).resolve().parent.parent
#: one line per injected fault (tests/test_faults_*.py), printed at the end of the session
FAULT_LINES: list[str] = []
#: one line per attack (tests/test_hostile*.py), likewise
HOSTILE_LINES: list[str] = []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for title, lines in (
        ("fault injection: what went in, what came out", FAULT_LINES),
        ("hostile input: each attack, what was refused, what was billed", HOSTILE_LINES),
    ):
        if lines:
            terminalreporter.section(title)
            for line in lines:
                terminalreporter.write_line(line)


@pytest.fixture(params=[None, 0], ids=["revisions-default", "revisions-off"])
def horizon(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> AuditSettings:
    """The configuration a hostile-input test attacks: the default (a 6 h revision horizon) and revisions off.

    A guarantee that holds only with a feature off does not hold, so every attack runs in both. It sets
    ``GPUCOST_REVISION_HORIZON_S`` for what runs through the command line, and returns the settings for
    what a test drives directly; ``horizon_label`` names it in the suite's summary lines.
    """
    from gpucost.streams.settings import AuditSettings

    if request.param is None:
        monkeypatch.delenv("GPUCOST_REVISION_HORIZON_S", raising=False)
        return AuditSettings()
    monkeypatch.setenv("GPUCOST_REVISION_HORIZON_S", str(request.param))
    return AuditSettings(revision_horizon_s=request.param)


def horizon_label(settings_: AuditSettings) -> str:
    """``R=6h`` or ``R=0``, for a summary line of the hostile-input suite."""
    seconds = settings_.revision_horizon_s
    return f"R={seconds // 3600}h" if seconds and seconds % 3600 == 0 else f"R={seconds}"


SHARED_DATA = Path(os.environ.get("GPUCOST_SHARED_DATA", ROOT.parent / "shared" / "data"))


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"the shared outside data is not at {SHARED_DATA}")
    return SHARED_DATA


@dataclass(frozen=True)
class Broker:
    """The session broker: plaintext, TLS (certificate generated here) and SCRAM listeners."""

    port: int
    ca_file: Path
    scram_user: str
    scram_password: str
    env: dict[str, str]

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def tls_bootstrap(self) -> str:
        return f"127.0.0.1:{self.port + 2}"

    @property
    def scram_bootstrap(self) -> str:
        return f"127.0.0.1:{self.port + 3}"


def make_certificate(folder: Path, password: str) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 in a PKCS12 keystore (Java's keytool), and its PEM."""
    keystore, pem = folder / "broker.p12", folder / "ca.pem"
    subprocess.run(
        [
            "keytool",
            "-genkeypair",
            "-alias",
            "broker",
            "-keyalg",
            "RSA",
            "-keysize",
            "2048",
            "-validity",
            "2",
            "-dname",
            "CN=127.0.0.1",
            "-ext",
            "SAN=IP:127.0.0.1,DNS:localhost",
            "-storetype",
            "PKCS12",
            "-keystore",
            str(keystore),
            "-storepass",
            password,
            "-keypass",
            password,
        ],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [
            "keytool",
            "-exportcert",
            "-rfc",
            "-alias",
            "broker",
            "-keystore",
            str(keystore),
            "-storepass",
            password,
            "-file",
            str(pem),
        ],
        check=True,
        capture_output=True,
    )
    return keystore, pem


def free_ports(n: int, rnd: random.Random | None = None) -> int:
    """The first of ``n`` consecutive ports nothing listens on now (the broker takes PORT to PORT+3:
    plaintext, controller, TLS, SASL), so that two test sessions on one host never collide."""
    rnd = rnd or random.Random()
    for _ in range(200):
        base = rnd.randrange(20_000, 60_000)
        try:
            with contextlib.ExitStack() as held:
                for port in range(base, base + n):
                    sock = held.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no {n} consecutive free ports found on 127.0.0.1")


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """One real Kafka broker for the whole test session, started by the project's own script."""
    # GPUCOST_TEST_KAFKA_PORT pins it (and PORT+1..PORT+3); otherwise a free block of four
    port = int(os.environ.get("GPUCOST_TEST_KAFKA_PORT") or free_ports(4))
    tls = tmp_path_factory.mktemp("tls")
    keystore, pem = make_certificate(tls, password := secrets.token_hex(12))
    broker = Broker(port, pem, "gpucost-test", secrets.token_hex(12), {})
    env = {
        **os.environ,
        "GPUCOST_KAFKA_PORT": str(port),
        "GPUCOST_KAFKA_DATA": str(tmp_path_factory.mktemp("kafka-data")),
        "GPUCOST_KAFKA_SSL_KEYSTORE": str(keystore),
        "GPUCOST_KAFKA_SSL_KEYSTORE_PASSWORD": password,
        "GPUCOST_KAFKA_SCRAM_USER": broker.scram_user,
        "GPUCOST_KAFKA_SCRAM_PASSWORD": broker.scram_password,
    }
    broker.env.update(env)
    script = ROOT / "scripts" / "kafka.sh"
    started = subprocess.run(["bash", str(script), "start"], env=env, capture_output=True, text=True, timeout=900)
    if started.returncode != 0:
        pytest.fail(f"scripts/kafka.sh start failed:\n{started.stderr[-3000:]}")
    yield broker
    subprocess.run(["bash", str(script), "stop"], env=env, capture_output=True, timeout=120)


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker: Broker) -> str:
    return kafka_broker.bootstrap


def record_fleet(base: Path, *fleet: str) -> tuple[Path, Path]:
    """A simulated fleet's events (``gpucost simulate`` with the flags ``fleet``) under ``base``, and the
    embedded run's output for them."""
    for args in (
        ["simulate", *fleet, "--out", str(base / "events")],
        ["replay", str(base / "events"), "--out", str(base / "embedded")],
    ):
        subprocess.run([sys.executable, "-m", "gpucost.cli", *args], cwd=ROOT, check=True, capture_output=True)
    return base / "events", base / "embedded"


@pytest.fixture(scope="session")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A simulated fleet's events, and the embedded run's output for them."""
    return record_fleet(
        tmp_path_factory.mktemp("recorded"), "--gpus", "3", "--hours", "74", "--interval-s", "20", "--seed", "11"
    )


@pytest.fixture(scope="module")
def browser():  # type: ignore[no-untyped-def]
    """A headless Chromium driven by selenium, for the HTML report's tests; skipped, saying why, where absent."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.skip("no chromium and chromedriver here (Debian: apt-get install chromium chromium-driver)")
    options = Options()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1300,2000"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    session = webdriver.Chrome(service=Service(driver), options=options)
    yield session
    session.quit()
