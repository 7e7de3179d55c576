"""Loading the audit settings: defaults < config file < environment < command-line flags."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from gpucost.schemas.codec import explain
from gpucost.streams.settings import AuditSettings

__all__ = ["AUDIT_ENV_PREFIX", "ConfigError", "FLAG_FIELDS", "KAFKA_ENV_PREFIX", "environment", "load_settings"]

#: settings that have a command-line flag (``--pane-s`` for ``pane_s``); the tables are file-only
FLAG_FIELDS = tuple(f for f in AuditSettings.model_fields if f not in ("l2_calibration", "peak_tops", "sla_tiers"))


#: ``GPUCOST_PANE_S`` sets ``pane_s``; ``GPUCOST_KAFKA_BOOTSTRAP`` sets the Kafka ``bootstrap``
AUDIT_ENV_PREFIX, KAFKA_ENV_PREFIX = "GPUCOST_", "GPUCOST_KAFKA_"


def environment(model: type[BaseModel], prefix: str, fields: tuple[str, ...] | None = None) -> dict[str, str]:
    """The values of ``model``'s fields (or of ``fields``) that the environment sets as ``<prefix><FIELD>``.

    Only the command line calls this: a settings model never reads the environment itself, so an
    operator, a test or a library user gets exactly the values passed.
    """
    names = fields if fields is not None else tuple(model.model_fields)
    return {f: os.environ[prefix + f.upper()] for f in names if prefix + f.upper() in os.environ}


class ConfigError(Exception):
    """A setting that cannot be used; the message names it and what is wrong."""


def load_settings(config_file: Path | None = None, **flags: Any) -> AuditSettings:
    """Defaults, then the file, then ``GPUCOST_<FIELD>`` (the tables only from the file), then the flags."""
    file_values: dict[str, Any] = {}
    if config_file is not None:
        try:
            file_values = tomllib.loads(config_file.read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read config file {config_file}: {exc.strerror}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError) as exc:  # binary; nested too deeply
            why = "nested too deeply" if isinstance(exc, RecursionError) else exc
            raise ConfigError(
                f"config file {config_file} is not valid TOML: {why}; write settings as name = value "
                "lines, such as pane_s = 60 (docs/operations.md, Configuration)"
            ) from None
        unknown = sorted(set(file_values) - set(AuditSettings.model_fields))
        if unknown:
            raise ConfigError(
                f"config file {config_file}: unknown setting(s) {', '.join(unknown)}; "
                f"known: {', '.join(AuditSettings.model_fields)}"
            )
    init = {
        **file_values,
        **environment(AuditSettings, AUDIT_ENV_PREFIX, FLAG_FIELDS),
        **{k: v for k, v in flags.items() if v is not None},
    }
    try:
        return AuditSettings(**init)
    except ValidationError as exc:
        raise ConfigError(f"invalid setting: {explain(exc)}") from None
