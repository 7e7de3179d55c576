"""Flags of seconds (``gpucost.env_flags.seconds``): a finite number above 0, and at most an hour for a live source's
deadline; a NaN or an infinity would be no deadline and no period. Each refusal names the flag's variable."""

from __future__ import annotations

import pytest

from gpucost.cli import main
from gpucost.env_flags import seconds

REFUSED = ["0", "-1", "nan", "inf", "-inf", "ten", ""]


@pytest.mark.parametrize("value", REFUSED)
@pytest.mark.parametrize(
    ("flag", "env"),
    [("--publish-delay-s", "GPUCOST_PUBLISH_DELAY_S"), ("--device-timeout-s", "GPUCOST_DEVICES_TIMEOUT_S")],
)
def test_a_bad_number_of_seconds_is_refused_naming_its_variable(
    flag: str, env: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as refused:
        main(["run", "--source", "simulate", f"{flag}={value}"])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and f"{value!r}: give a number of seconds above 0" in err and env in err


def test_only_a_deadline_is_bounded_by_an_hour(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        main(["run", "--source", "simulate", "--device-timeout-s", "3600.5"])
    assert refused.value.code == 2 and "at most 3600" in capsys.readouterr().err
    assert seconds("GPUCOST_DEVICES_TIMEOUT_S", 3600)("3600") == 3600.0
    assert seconds("GPUCOST_PUBLISH_DELAY_S")("86400") == 86400.0  # a day between publications: slow, not wrong
