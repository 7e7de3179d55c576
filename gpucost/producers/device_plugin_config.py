"""What NVIDIA's k8s-device-plugin config file says of a node's shared GPUs (``--kube-sharing-config``): for each
resource it replicates, whether its replicas are time slices or MPS clients, and how many each GPU has.

The schema is the plugin's own, ``api/config/v1`` of github.com/NVIDIA/k8s-device-plugin (``config.go``,
``sharing.go``, ``replicas.go``): ``version`` (``v1``, or unset), then ``sharing.timeSlicing`` and
``sharing.mps``, each ``renameByDefault``, ``failRequestsGreaterThanOne`` and a non-empty ``resources`` list
of ``name``, ``rename``, ``devices`` (``all``, the default; a count; or a list of GPU indices, MIG indices
``<gpu>:<mig>`` or UUIDs) and ``replicas`` (2 or more). Where ``sharing.mps`` is set the plugin replicates by
MPS alone (``Sharing.ReplicatedResources``), and so does this table. What the table does not know, and the
flags then say: docs/sources.md, "The device plugin's config".
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

__all__ = [
    "ConfigInvalid",
    "PluginSharing",
    "Replicated",
    "SharingConfigFile",
    "parse_plugin_config",
    "read_plugin_config",
]

log = logging.getLogger("gpucost.kubernetes")

#: the plugin's ``DefaultSharedResourceNameSuffix``: ``renameByDefault`` advertises ``<name>.shared``
SHARED_SUFFIX = ".shared"
#: a ``devices`` list's entries the plugin accepts: a GPU index, a MIG index, a GPU's or a MIG device's UUID
_INDEX = re.compile(r"[0-9]+(?::[0-9]+)?")
_UUID = re.compile(r"(?:GPU|MIG)-[0-9A-Za-z/_-]+")
#: the config's sections, and the mode (``SHARED_MODES``) each gives its replicas
SECTIONS = {"mps": "mps", "timeSlicing": "time_slicing"}


class ConfigInvalid(ValueError):
    """The file is not the device plugin's config; the message says what to fix."""


class Replicated(NamedTuple):
    """What one ``resources`` entry makes of each GPU it replicates."""

    mode: str  # time_slicing or mps
    replicas: int


@dataclass(frozen=True)
class _Entry:
    names: frozenset[str]  # the resource names the kubelet may list it under: name, rename, name.shared
    devices: object  # "all", a count, or a tuple of device refs (indices or UUIDs)
    replicated: Replicated


@dataclass(frozen=True)
class PluginSharing:
    """The config's replicated resources, looked up by the resource name the kubelet lists and the GPU."""

    entries: tuple[_Entry, ...] = ()

    def lookup(self, resource: str, gpu: str) -> Replicated | str:
        """The entry that replicates ``gpu`` under ``resource``, or why none is chosen (a count's name)."""
        named = [e for e in self.entries if resource in e.names]
        if not named:
            return "kube_sharing_config_unmatched"
        listed = {e.replicated for e in named if isinstance(e.devices, tuple) and gpu in e.devices}
        # an entry whose list names UUIDs only, not this one, cannot be this GPU's; an index or a count might be
        maybe = listed or {e.replicated for e in named if not _uuids_only(e.devices)}
        return maybe.pop() if len(maybe) == 1 else "kube_sharing_config_ambiguous"


def _uuids_only(devices: object) -> bool:
    return isinstance(devices, tuple) and all(_UUID.fullmatch(d) for d in devices)


def _fail(where: str, what: str) -> ConfigInvalid:
    return ConfigInvalid(f"{where}: {what} (the device plugin's schema: api/config/v1 of NVIDIA/k8s-device-plugin)")


def _devices(value: object, where: str) -> object:
    if value is None or value == "all":
        return "all"
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            raise _fail(where, f"devices {value}: a count of devices must be > 0")
        return value
    if isinstance(value, list):
        refs = tuple(str(v) if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else v for v in value)
        bad = [r for r in refs if not (isinstance(r, str) and (_INDEX.fullmatch(r) or _UUID.fullmatch(r)))]
        if bad:
            raise _fail(where, f"devices {bad[0]!r}: write a GPU index, a MIG index <gpu>:<mig> or a UUID")
        return refs
    raise _fail(where, f"devices {value!r}: write all, a count, or a list of GPU indices or UUIDs")


def _resource(item: object, where: str, mode: str, by_default: bool) -> _Entry:
    if not isinstance(item, dict):
        raise _fail(where, "each resources entry is a mapping of name, replicas and optionally rename, devices")
    name, rename, replicas = item.get("name"), item.get("rename"), item.get("replicas")
    if not isinstance(name, str) or not name:
        raise _fail(where, "no resource name specified (name: nvidia.com/gpu)")
    if rename is not None and not isinstance(rename, str):
        raise _fail(where, f"rename {rename!r}: write a resource name")
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 2:
        raise _fail(where, f"replicas {replicas!r}: the number of replicas must be a whole number >= 2")
    # the plugin advertises ``name``, or ``name.shared`` with renameByDefault; its releases before the one that
    # stopped honouring ``rename`` (DisableResourceNamingInConfig) advertised ``rename``: any of them is this entry
    names = {name + SHARED_SUFFIX if by_default else name} | ({rename} if rename else set())
    return _Entry(frozenset(names), _devices(item.get("devices"), where), Replicated(mode, replicas))


def parse_plugin_config(doc: object) -> PluginSharing:
    """The table of a parsed config file (YAML's or JSON's value); ``ConfigInvalid`` where it is not the schema."""
    if not isinstance(doc, dict):
        raise _fail("the file", "not a mapping of version and sharing")
    if doc.get("version") not in (None, "", "v1"):
        raise _fail("version", f"unknown version {doc['version']!r}: write v1")
    sharing = doc.get("sharing")
    if sharing is None:
        return PluginSharing()
    if not isinstance(sharing, dict):
        raise _fail("sharing", "not a mapping of timeSlicing and mps")
    key = "mps" if sharing.get("mps") is not None else "timeSlicing"
    section: Any = sharing.get(key)
    if section is None:
        return PluginSharing()
    where = f"sharing.{key}"
    if not isinstance(section, dict):
        raise _fail(where, "not a mapping of renameByDefault, failRequestsGreaterThanOne and resources")
    for flag in ("renameByDefault", "failRequestsGreaterThanOne"):
        if not isinstance(section.get(flag, False), bool):
            raise _fail(f"{where}.{flag}", f"{section[flag]!r}: write true or false")
    resources = section.get("resources")
    if not isinstance(resources, list) or not resources:
        raise _fail(f"{where}.resources", "no resources specified")
    by_default = bool(section.get("renameByDefault", False))
    return PluginSharing(
        tuple(_resource(r, f"{where}.resources[{i}]", SECTIONS[key], by_default) for i, r in enumerate(resources))
    )


def read_plugin_config(path: Path) -> PluginSharing:
    """The table of the config file at ``path``, YAML or JSON; ``ConfigInvalid`` where it cannot be read or parsed."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigInvalid(f"cannot read it ({type(exc).__name__}: {exc}): check the ConfigMap's mount") from exc
    try:
        import yaml  # the kubernetes extra's (pyproject.toml)
    except ImportError:  # JSON alone, then
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise ConfigInvalid(f"not JSON, and PyYAML is missing: pip install 'gpucost[kubernetes]' ({exc})") from exc
        return parse_plugin_config(doc)
    try:
        doc = yaml.safe_load(text)  # JSON is YAML
    except yaml.YAMLError as exc:
        raise ConfigInvalid(f"not YAML or JSON ({exc})") from exc
    return parse_plugin_config(doc)


@dataclass
class SharingConfigFile:
    """The config file, read again when it changes (a ConfigMap's update reaches its mount): its table, or None
    while it cannot be read or is not the schema, counted ``kube_sharing_config_invalid`` and logged once for
    each version of the file."""

    path: Path
    _seen: tuple[int, int] | None = field(default=None, repr=False)
    _table: PluginSharing | None = field(default=None, repr=False)

    def table(self, counts: Counter[str]) -> PluginSharing | None:
        try:
            st = os.stat(self.path)
            version: tuple[int, int] = (st.st_mtime_ns, st.st_size)
        except OSError:
            version = (-1, -1)
        if version != self._seen:
            self._seen = version
            try:
                self._table = read_plugin_config(self.path)
            except ConfigInvalid as exc:
                self._table = None
                counts["kube_sharing_config_invalid"] += 1
                log.warning(
                    "the device plugin config %s is not used (%s); shared GPUs get --kube-replicas and "
                    '--kube-sharing until it is fixed (docs/sources.md, "The device plugin\'s config")',
                    self.path,
                    exc,
                )
        return self._table
