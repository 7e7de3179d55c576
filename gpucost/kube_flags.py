"""The flags of a Kubernetes node's sources (``--kube-*``): where attribution reads the pods and the GPUs the
kubelet gave them, and what allocations from the kubelet need to be told (docs/operations.md)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from gpucost.env_flags import env_flag, on_off
from gpucost.producers.kubernetes import LABELS, KubernetesSettings
from gpucost.producers.kubernetes_allocations import SHARED_MODES

__all__ = ["add_kubernetes"]


def _kube_label(text: str) -> tuple[str, tuple[str, ...]]:
    name, sep, keys = text.partition("=")
    found = tuple(k for k in keys.split(",") if k)
    if not sep or name not in LABELS or not found:
        raise argparse.ArgumentTypeError(f"{text!r}: write FIELD=KEY[,KEY…] with FIELD one of {', '.join(LABELS)}")
    return name, found


def _replicas(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or not 2 <= int(text) <= 1_000_000:
        raise argparse.ArgumentTypeError(
            f"{text!r}: write the device plugin config's replicas per GPU, a whole number from 2 (its "
            "sharing.timeSlicing or sharing.mps resources' replicas)"
        )
    return int(text)


def _shared_mode(text: str) -> str:
    if text not in SHARED_MODES:
        raise argparse.ArgumentTypeError(f"{text!r}: write {' or '.join(SHARED_MODES)}")
    return text


def add_kubernetes(p: argparse.ArgumentParser) -> None:
    """``--kube-*``, in a group of their own."""
    g = p.add_argument_group("Kubernetes attribution (with --attribution kubernetes: docs/operations.md)")
    env_flag(
        g,
        "--kube-pods-url",
        "GPUCOST_KUBE_PODS_URL",
        str,
        None,
        "a URL answering a PodList of this node's pods, with the service account's token (unset: the API "
        "server the pod runs under, pods of --kube-node)",
    )
    env_flag(
        g, "--kube-node", "NODE_NAME", str, None, "this node's name in Kubernetes (the Downward API's spec.nodeName)"
    )
    env_flag(
        g,
        "--kube-token-file",
        "GPUCOST_KUBE_TOKEN_FILE",
        Path,
        str(KubernetesSettings.token_file),
        "a bearer token for the pods' URL (a pod's service account's, by default), sent where the file exists",
    )
    env_flag(
        g,
        "--kube-ca-file",
        "GPUCOST_KUBE_CA_FILE",
        Path,
        str(KubernetesSettings.ca_file),
        "the CA that signed the pods' URL's certificate (the cluster's, by default), where the file exists",
    )
    env_flag(
        g,
        "--kube-pod-resources",
        "GPUCOST_KUBE_POD_RESOURCES",
        Path,
        str(KubernetesSettings.pod_resources),
        "the kubelet's pod-resources socket, which tells the pod a GPU was given to",
    )
    g.add_argument(
        "--kube-label",
        type=_kube_label,
        action="append",
        metavar="FIELD=KEY[,KEY…]",
        default=[_kube_label(v) for v in os.environ.get("GPUCOST_KUBE_LABELS", "").split()],
        help="the pod label or annotation keys that give a binding field, first set wins; again for each "
        "field (env GPUCOST_KUBE_LABELS, space-separated; default: "
        + "; ".join(f"{k}={','.join(v)}" for k, v in LABELS.items())
        + ")",
    )
    env_flag(
        g,
        "--kube-allocations",
        "GPUCOST_KUBE_ALLOCATIONS",
        on_off,
        "off",
        "on: also send what each pod holds of the node's GPUs, as allocation events from the kubelet (the "
        'allocation basis: docs/sources.md, "Allocations from the kubelet")',
    )
    env_flag(
        g,
        "--kube-replicas",
        "GPUCOST_KUBE_REPLICAS",
        _replicas,
        None,
        "with --kube-allocations on: the replicas of each shared GPU in the device plugin's config (unset: a "
        "replica is not sent, counted kube_alloc_replicas_unset)",
    )
    env_flag(
        g,
        "--kube-sharing",
        "GPUCOST_KUBE_SHARING",
        _shared_mode,
        "time_slicing",
        "with --kube-allocations on: what the device plugin's replicas are, time_slicing or mps (its config's "
        "sharing section)",
    )
    env_flag(
        g,
        "--kube-sharing-config",
        "GPUCOST_KUBE_SHARING_CONFIG",
        Path,
        None,
        "with --kube-allocations on: the NVIDIA device plugin's config file (its ConfigMap, mounted), YAML or "
        "JSON; each shared GPU gets the mode and replicas of its resource's entry there, and --kube-replicas, "
        "--kube-sharing where the file does not say or cannot be read (docs/sources.md, \"The device plugin's "
        'config")',
    )
