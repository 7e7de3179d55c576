"""The flags of allocations from Slurm (``--slurm-*``): on a Slurm compute node, what each job holds of its GPUs,
read from ``scontrol`` (docs/operations.md; docs/sources.md, "Allocations from Slurm")."""

from __future__ import annotations

import argparse
import socket

from gpucost.env_flags import env_flag, on_off

__all__ = ["add_slurm"]


def add_slurm(p: argparse.ArgumentParser) -> None:
    """``--slurm-*``, in a group of their own."""
    g = p.add_argument_group("allocations from Slurm (docs/operations.md)")
    for flag, kind, default, what in (
        (
            "allocations",
            on_off,
            "off",
            "on: also send what each Slurm job holds of this node's GPUs (its gpu, shard and mps GRES), as "
            'allocation events read from scontrol (the allocation basis: docs/sources.md, "Allocations from Slurm")',
        ),
        (
            "node",
            str,
            socket.gethostname().split(".")[0],
            "with --slurm-allocations on: this node's name in Slurm (its NodeName in slurm.conf; by default the "
            "short host name)",
        ),
        (
            "gpus",
            str,
            "nvml",
            "with --slurm-allocations on: which device each GPU index of Slurm's GRES is: 'nvml' (NVML's order, "
            "that of gres.conf's AutoDetect=nvml), 'minor' (the /dev/nvidiaN order, that of a gres.conf naming "
            "each File= without AutoDetect), or a file of '<index> <uuid>' lines (MIG devices need one)",
        ),
    ):
        env_flag(g, f"--slurm-{flag}", f"GPUCOST_SLURM_{flag.upper()}", kind, default, what)
