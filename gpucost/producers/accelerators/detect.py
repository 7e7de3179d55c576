"""Which tool wrote a capture, told from its content, and the parser for it."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from gpucost.producers.accelerators import amd_exporter, amd_smi, dcgm_exporter, gaudi, neuron, rocm_smi, tpu, xbutil
from gpucost.producers.accelerators.capture import body
from gpucost.schemas.devices import Parsed

__all__ = ["FORMATS", "detect", "parse"]

FORMATS: dict[str, Callable[[str], Parsed]] = {
    "amd-smi-text": amd_smi.parse_text,
    "amd-smi-json": amd_smi.parse_json,
    "rocm-smi": rocm_smi.parse,
    "amd-exporter": amd_exporter.parse,
    "dcgm-exporter": dcgm_exporter.parse,
    "neuron-monitor": neuron.parse_scrape,
    "neuron-monitor-json": neuron.parse_json,
    "neuron-ls": neuron.parse_ls,
    "tpu-info": tpu.parse,
    "hl-smi": gaudi.parse_table,
    "hl-smi-csv": gaudi.parse_csv,
    "xbutil": xbutil.parse,
}


def _json_format(text: str) -> str | None:
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return "amd-smi-json" if text.lstrip().startswith("[") else None  # a truncated list: let it say why
    if isinstance(data, dict) and "neuron_runtime_data" in data:
        return "neuron-monitor-json"
    if isinstance(data, dict) and "devices" in data:
        return "xbutil"
    if isinstance(data, dict) and any(re.fullmatch(r"card\d+", k) for k in data):
        return "rocm-smi"
    if isinstance(data, list) and data and all(isinstance(e, dict) and "gpu" in e for e in data):
        return "amd-smi-json"
    return None


def detect(text: str) -> str | None:
    """The format name of ``FORMATS`` that wrote ``text``, or None when no known tool did."""
    lines = body(text)
    joined = "\n".join(lines)
    if "HL-SMI" in joined or "AIP-Util" in joined:  # before JSON: a log's lines open with "[time]"
        return "hl-smi"
    head = joined.lstrip()[:1]
    if head in "[{" and head:
        return _json_format(joined)
    if "neuroncore_utilization_ratio" in joined or "neuron_hardware_info" in joined:
        return "neuron-monitor"
    if re.search(r"^DCGM_FI_\w+[{ ]", joined, re.M):
        return "dcgm-exporter"
    if re.search(r"^gpu_\w+\{", joined, re.M):
        return "amd-exporter"
    if re.search(r"\|\s*NEURON\s*\|\s*NEURON", joined):
        return "neuron-ls"
    if re.search(r"^[^\n]*(utilization\.aip|memory\.used \[)[^\n]*$", joined, re.M) and "," in joined:
        return "hl-smi-csv"
    if re.search(r"TPU (Chips|Runtime Utilization|Duty Cycle|HBM Usage|Process Info|Utilization)", joined):
        return "tpu-info"
    if re.search(r"^GPU: \d+$", joined, re.M) or re.search(r"^GPU\s{2,}(POWER|NAME)", joined, re.M):
        return "amd-smi-text"
    return None


def parse(text: str, fmt: str | None = None) -> tuple[str | None, Parsed]:
    """The capture parsed by ``fmt`` (detected when None); an unknown format is one dead letter."""
    name = fmt or detect(text)
    if name is None:
        out = Parsed()
        out.reject(f"unknown format: none of {', '.join(FORMATS)} (force one with --input-format)")
        return None, out
    return name, FORMATS[name](text)
