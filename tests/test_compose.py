"""The deployment files: the compose file parses, and every gpucost command in it is one the CLI accepts."""
from __future__ import annotations

import yaml

from gpucost.cli import _parser
from tests.conftest import ROOT


def test_compose_services_run_valid_gpucost_commands() -> None:
    doc = yaml.safe_load((ROOT / "compose" / "docker-compose.yml").read_text())
    services = doc["services"]
    assert {"kafka", "topics", "producer", "worker", "sink"} <= set(services)
    parser = _parser()
    for name, service in services.items():
        if name == "kafka":
            continue
        assert service["build"]["dockerfile"] == "compose/Dockerfile"
        assert service["environment"]["GPUCOST_KAFKA_BOOTSTRAP"] == "kafka:9092"
        args = parser.parse_args(service["command"])  # exits (fails the test) on an invalid command
        assert args.command == service["command"][0]
    assert (ROOT / "compose" / "Dockerfile").read_text().count("COPY") >= 6
