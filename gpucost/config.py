"""Loading the audit settings: defaults < config file < environment < command-line flags."""
from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from schemas.codec import explain
from streams.settings import AuditSettings

__all__ = ["ConfigError", "load_settings", "FLAG_FIELDS"]

#: settings that have a command-line flag (``--pane-s`` for ``pane_s``); the table is file-only
FLAG_FIELDS = tuple(f for f in AuditSettings.model_fields if f != "l2_calibration")


class ConfigError(Exception):
    """A setting that cannot be used; the message names it and what is wrong."""


def load_settings(config_file: Path | None = None, **flags: Any) -> AuditSettings:
    file_values: dict[str, Any] = {}
    if config_file is not None:
        try:
            file_values = tomllib.loads(config_file.read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read config file {config_file}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {config_file} is not valid TOML: {exc}") from None
        unknown = sorted(set(file_values) - set(AuditSettings.model_fields))
        if unknown:
            raise ConfigError(f"config file {config_file}: unknown setting(s) {', '.join(unknown)}; "
                              f"known: {', '.join(AuditSettings.model_fields)}")
    from_env = {f for f in AuditSettings.model_fields if f"GPUCOST_{f.upper()}" in os.environ}
    init = {k: v for k, v in file_values.items() if k not in from_env}
    init.update({k: v for k, v in flags.items() if v is not None})
    try:
        return AuditSettings(**init)
    except ValidationError as exc:
        raise ConfigError(f"invalid setting: {explain(exc)}") from None
