from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=150, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", max_examples=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("GPUCOST_SHARED_DATA", ROOT.parent / "shared" / "data"))


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"the shared outside data is not at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One real Kafka broker for the whole test session, started by the project's own script."""
    port = os.environ.get("GPUCOST_TEST_KAFKA_PORT", "19392")
    env = {**os.environ, "GPUCOST_KAFKA_PORT": port,
           "GPUCOST_KAFKA_DATA": str(tmp_path_factory.mktemp("kafka-data"))}
    script = ROOT / "scripts" / "kafka.sh"
    started = subprocess.run(["bash", str(script), "start"], env=env, capture_output=True, text=True, timeout=900)
    if started.returncode != 0:
        pytest.fail(f"scripts/kafka.sh start failed:\n{started.stderr[-3000:]}")
    yield f"127.0.0.1:{port}"
    subprocess.run(["bash", str(script), "stop"], env=env, capture_output=True, timeout=120)
