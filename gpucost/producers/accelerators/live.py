"""Live mode: run the vendor's own tool, when installed, and parse what it prints.

Each format names the command that prints it. A tool that is missing, fails, or outlives its
timeout gives no samples and one counted reason; nothing here raises to the caller.
"""

from __future__ import annotations

import shutil
import subprocess

from gpucost.producers.accelerators.detect import FORMATS
from gpucost.schemas.devices import Parsed

__all__ = ["COMMANDS", "run_tool"]

COMMANDS: dict[str, list[str]] = {
    "amd-smi-text": ["amd-smi", "monitor", "-ptumv"],
    "amd-smi-json": ["amd-smi", "metric", "--power", "--usage", "--mem-usage", "--json"],
    "rocm-smi": ["rocm-smi", "--showallinfo", "--json"],
    "neuron-ls": ["neuron-ls", "--show-all-procs"],
    "tpu-info": ["tpu-info"],
    "hl-smi": ["hl-smi"],
    "hl-smi-csv": [
        "hl-smi",
        "-Q",
        "timestamp,name,bus_id,utilization.aip,power.draw,memory.used,memory.total,temperature.aip",
        "-f",
        "csv",
    ],
    "xbutil": [
        "xbutil",
        "examine",
        "-r",
        "electrical",
        "thermal",
        "platform",
        "-f",
        "JSON",
        "-o",
        "/dev/stdout",
        "--force",
    ],
}


def run_tool(fmt: str, timeout_s: float = 10.0) -> Parsed:
    """The samples the tool of ``fmt`` prints now (scrape formats are read with ``curl`` into a file)."""
    out = Parsed()
    argv = COMMANDS.get(fmt)
    if argv is None:
        out.reject(f"{fmt}: no live command (scrape it to a file; live: {', '.join(COMMANDS)})")
        return out
    exe = shutil.which(argv[0])
    if exe is None:
        out.reject(f"{argv[0]}: not installed (not on PATH)")
        return out
    try:
        done = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        out.reject(f"{argv[0]}: no answer within {timeout_s:g} s")
        return out
    except OSError as exc:
        out.reject(f"{argv[0]}: cannot run ({exc.strerror})")
        return out
    if done.returncode != 0:
        out.reject(f"{argv[0]}: exit status {done.returncode}: {done.stderr.strip()[:200]}")
        return out
    return FORMATS[fmt](done.stdout)
