"""The commands that act on the audit: health snapshots and their verification for admission, service discovery
(Prometheus ``file_sd``) and reclaim triggers (webhooks, an actions file)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from collections import Counter
from pathlib import Path

from gpucost.command import Command
from gpucost.discovery import from_output, refusals, write_file_sd
from gpucost.flags import add_kafka, add_out, env_default, env_flag
from gpucost.health import audit_secrets, read_json, snapshot_of, snapshot_problems
from gpucost.kafka.signing import parse_keys
from gpucost.kafka_commands import follow_discovery, follow_reclaim
from gpucost.local_state import state_dir
from gpucost.otlp import (
    admission_coverage,
    coverage_report,
    export_request,
    is_otlp_export,
    post,
    read_requests,
    to_json,
)
from gpucost.output_files import check_writable, made_folder, write_whole
from gpucost.reclaim import Ledger, Reclaimer
from gpucost.reclaim import from_output as reclaim_from_output
from gpucost.sinks.views import sql_string, view_records
from gpucost.streams.discovery import TARGET_PORT
from gpucost.times import iso_ns
from gpucost.webhook import WebhookSettings, url_problem
from gpucost.wiring import UsageError, invoked_as, load_keys, output_to_read

__all__ = ["cmd_discovery", "cmd_health", "cmd_reclaim"]


def cmd_health(args: argparse.Namespace) -> int:
    """``health snapshot``: a GPU's latest record to a file; ``health verify``: check one (exit 1 if it fails)."""
    if args.health_command == "snapshot":
        output_to_read(args.out)
        doc = snapshot_of(args.out, args.gpu)
        if doc is None:
            raise UsageError(
                f"no health record of GPU {args.gpu!r} under {args.out}; list them with: "
                f'{invoked_as()} query --out {args.out} "SELECT DISTINCT gpu_uuid FROM health"'
            )
        write_whole(args.file, json.dumps(doc, indent=1, ensure_ascii=False) + "\n", "--file")
        record = doc["record"]
        print(
            f"{args.file}: GPU {args.gpu}, window ending {iso_ns(record['window_end_ns'])}, grade {record['grade']}, "
            f"breaker {record['breaker_state']}, {'signed' if record['signature'] else 'unsigned'}"
        )
        return 0
    if args.health_command == "export-otlp":
        return _export_otlp(args)
    if is_otlp_export(args.file):
        try:
            ok, lines = coverage_report(admission_coverage(read_requests(args.file)), args.admission_h)
        except ValueError as exc:
            raise UsageError(f"{exc}; give the JSON of gpucost health export-otlp --json, or a collector's") from None
        print(
            f"{args.file}: OTLP export, {'covers' if ok else 'does NOT cover'} {args.admission_h} h for every GPU",
            *(f"- {line}" for line in lines or ["no gpucost.health.coverage points at all"]),
            sep="\n",
        )
        return 0 if ok else 1
    secrets = None
    if args.key_file is not None:
        secrets = {
            k.key_id: k.secret for k in load_keys(lambda p: parse_keys(p.read_text(), str(p)), args.key_file).values()
        }
        if not secrets:  # else every signature would "match none of the keys given", blaming the snapshot
            raise UsageError(f"--key-file {args.key_file} holds no key; give the '<key_id> <secret hex>' lines")
    try:
        doc = read_json(args.file)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    problems, signer = snapshot_problems(doc, secrets)
    if problems:
        print(f"{args.file}: FAILS verification", *(f"- {p}" for p in problems), sep="\n")
        return 1
    how = f"hash and signature (key {signer!r})" if signer else "hash only; pass --key-file to check the signature"
    print(
        f"{args.file}: verified, {how}. GPU {doc['device']['gpu_uuid']} on {doc['device']['node_id']}, "
        f"grade {doc['record']['grade']}, breaker {doc['record']['breaker_state']}"
    )
    return 0


def _export_otlp(args: argparse.Namespace) -> int:
    """The health records under ``--out`` as OTLP metrics: POSTed to ``--endpoint``, and/or as JSON to ``--json``."""
    output_to_read(args.out)
    if args.endpoint is None and args.json is None:
        raise UsageError(
            "say where to: --endpoint http://HOST:4318/v1/metrics (env GPUCOST_OTLP_ENDPOINT), --json FILE, or both"
        )
    where = "" if args.gpu is None else f"WHERE gpu_uuid = {sql_string(args.gpu)}"
    if args.json is not None:
        check_writable(args.json, "--json")
    records = view_records(args.out, "health", f"{where} ORDER BY gpu_uuid, window_start_ns")
    if not records:  # an empty export would read as GPUs with no audited time
        raise UsageError(
            f"no health record{'' if args.gpu is None else ' of GPU ' + repr(args.gpu)} under "
            f"{args.out}; give the --out of a gpucost run, replay or sink that audited GPUs"
        )
    request = export_request(records)
    if args.json is not None:
        write_whole(args.json, json.dumps(to_json(request)) + "\n", "--json")
    if args.endpoint is not None:
        try:
            post(args.endpoint, request)
        except RuntimeError as exc:
            raise UsageError(str(exc)) from None
    print(
        f"{len(records):,} health window(s) exported as OTLP metrics"
        + (f" to {args.endpoint}" if args.endpoint else "")
        + (f", JSON in {args.json}" if args.json else "")
    )
    return 0


def cmd_discovery(args: argparse.Namespace) -> int:
    """The nodes in service as a Prometheus file_sd file: once from ``--out``, or following the health topic."""
    if args.file_sd is None:
        raise UsageError("say where to write the file_sd JSON: --file-sd FILE (or GPUCOST_FILE_SD)")
    if bad := [label for label in args.label if "=" not in label]:
        raise UsageError(f"--label takes NAME=VALUE, got {bad[0]!r}")
    labels = dict(label.split("=", 1) for label in args.label)
    secrets = load_keys(audit_secrets, args.audit_keys) if args.audit_keys else None
    if args.out is None:
        return follow_discovery(args, labels, secrets)
    if args.verify_keys is not None:
        raise UsageError(
            "--verify-keys checks the signatures of Kafka messages, and an output directory has none: "
            "pass --audit-keys FILE (the audit keys) to verify each health record's hash and signature"
        )
    output_to_read(args.out)
    refused: Counter[str] = Counter()
    sd = from_output(args.out, secrets, refused)
    try:
        groups = sd.file_sd(args.target_port, labels)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    write_file_sd(args.file_sd, groups)
    out = sorted(set(sd.nodes()) - set(sd.in_service()))
    print(
        f"{args.file_sd}: {len(groups)} node(s) in service of {len(sd.nodes())}"
        + (f"; out: {', '.join(out)}" if out else "")
    )
    if said := refusals(refused, sd):
        print(f"gpucost: discovery: {said}", file=sys.stderr)
    return 0


def cmd_reclaim(args: argparse.Namespace) -> int:
    """Act on the reclaim triggers once each: from ``--out`` once, or following the reclaim topic."""
    if args.webhook is None and args.actions_file is None and not args.dry_run:
        raise UsageError("say how to act: --webhook URL, --actions-file FILE (or both), or --dry-run")
    if args.webhook is not None and (problem := url_problem(args.webhook)):
        raise UsageError(f"--webhook {args.webhook!r}: {problem}")
    try:
        settings = WebhookSettings(**{f.name: getattr(args, f.name) for f in dataclasses.fields(WebhookSettings)})
    except ValueError as exc:
        raise UsageError(f"{exc}; see gpucost reclaim --help") from None
    if args.ledger is None:
        args.ledger = state_dir() / "reclaim-ledger.txt"
        if not args.dry_run:
            made_folder(args.ledger.parent, "--ledger")
    if not args.dry_run:  # a path it cannot append to is said now, not when the first trigger comes
        for path, flag in ((args.actions_file, "--actions-file"), (args.ledger, "--ledger")):
            if path is not None:
                check_writable(path, flag)
    reclaimer = Reclaimer(
        None if args.dry_run else Ledger(args.ledger), args.webhook, args.actions_file, args.dry_run, settings
    )
    if args.out is None:
        return follow_reclaim(args, reclaimer)
    output_to_read(args.out, holding=True)
    asyncio.run(reclaimer.act(reclaim_from_output(args.out)))
    print(", ".join(f"{k}: {v:,}" for k, v in reclaimer.counts.items()))
    if failed := reclaimer.counts["failed"]:  # a cron job or a script must see it: exit 1, as a failed check does
        print(
            f"gpucost: reclaim: {failed:,} trigger(s) not delivered (not in the ledger); run the same command "
            "again to retry them",
            file=sys.stderr,
        )
        return 1
    return 0


# --- the command line: each command's flags and its entry in the table of gpucost.cli ---


def _discovery_arguments(p: argparse.ArgumentParser) -> None:
    env_flag(p, "--file-sd", "GPUCOST_FILE_SD", Path, None, "the file_sd JSON file to keep (replaced atomically)")
    p.add_argument(
        "--out",
        type=Path,
        default=env_default("GPUCOST_DISCOVERY_OUT", None),
        help="read the health view of this output directory once (env GPUCOST_DISCOVERY_OUT; unset: "
        "follow the Kafka health topic, and publish each node's entry to the discovery topic)",
    )
    env_flag(
        p,
        "--target-port",
        "GPUCOST_DISCOVERY_PORT",
        int,
        str(TARGET_PORT),
        "each target is node:PORT, the exporter Prometheus should scrape (9400: the DCGM exporter's port); "
        "a node whose name is not a host name or a routable IP address is left out",
    )
    p.add_argument(
        "--label", action="append", default=[], metavar="NAME=VALUE", help="a label for every target group (repeatable)"
    )
    env_flag(
        p,
        "--verify-keys",
        "GPUCOST_DISCOVERY_VERIFY_KEYS",
        Path,
        None,
        "apply only health messages signed by a key in this keyring file (the workers' output keys; the "
        "Kafka topic only)",
    )
    env_flag(
        p,
        "--audit-keys",
        "GPUCOST_DISCOVERY_AUDIT_KEYS",
        Path,
        None,
        "count only health records whose hash holds and whose signature is by a key in this file (the audit "
        "keys, as for health verify --key-file); others are refused and counted",
    )
    add_kafka(p)


def _reclaim_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out",
        type=Path,
        default=env_default("GPUCOST_RECLAIM_OUT", None),
        help="act on the reclaim view of this output directory once (env GPUCOST_RECLAIM_OUT; unset: "
        "follow the Kafka reclaim topic)",
    )
    env_flag(
        p,
        "--webhook",
        "GPUCOST_RECLAIM_WEBHOOK",
        str,
        None,
        "POST each action as JSON here (http or https), with Idempotency-Key: <trigger_id>; retried until a "
        "2xx, up to --max-attempts",
    )
    env_flag(
        p,
        "--actions-file",
        "GPUCOST_RECLAIM_ACTIONS_FILE",
        Path,
        None,
        "append each action, with its outcome, to this JSON Lines file",
    )
    env_flag(
        p,
        "--ledger",
        "GPUCOST_RECLAIM_LEDGER",
        Path,
        None,
        "the trigger ids already acted on, never acted on again (default: reclaim-ledger.txt in the state folder, "
        "$XDG_STATE_HOME/gpucost or ~/.local/state/gpucost, shared by every run on this machine)",
    )
    p.add_argument("--dry-run", action="store_true", help="print what would be done; act on nothing, commit nothing")
    env_flag(p, "--group", "GPUCOST_RECLAIM_GROUP", str, "gpucost-reclaim", "the Kafka consumer group")
    env_flag(
        p,
        "--verify-keys",
        "GPUCOST_RECLAIM_VERIFY_KEYS",
        Path,
        None,
        "act only on triggers signed by a key in this keyring file (the workers' output keys)",
    )
    bounds = p.add_argument_group(
        "each webhook attempt's bounds and the retries (a redirect is a failed attempt, never followed)"
    )
    for f in dataclasses.fields(WebhookSettings):
        env_flag(
            bounds,
            f"--{f.name.replace('_', '-')}",
            f"GPUCOST_RECLAIM_{f.name.upper()}",
            type(f.default),
            str(f.default),
            f.metadata["help"],
        )
    add_kafka(p)


def _health_arguments(p: argparse.ArgumentParser) -> None:
    hsub = p.add_subparsers(dest="health_command", required=True)
    snap = hsub.add_parser("snapshot", help="write a GPU's latest health record, with its device, as a JSON file")
    snap.add_argument("--gpu", required=True, help="the GPU's UUID")
    add_out(snap, "output directory holding the health records")
    snap.add_argument(
        "--file",
        type=Path,
        default=Path("health-snapshot.json"),
        help="the snapshot file to write (default ./health-snapshot.json)",
    )
    ver = hsub.add_parser(
        "verify", help="check a snapshot's hash, device and (with --key-file) signature; exit 1 if it fails, saying why"
    )
    ver.add_argument("file", type=Path, help="a snapshot, or an OTLP JSON export (then: does it cover --admission-h?)")
    env_flag(
        ver,
        "--key-file",
        "GPUCOST_AUDIT_KEY_FILE",
        Path,
        None,
        "the audit key(s) the signature must be one of, '<key_id> <secret hex>' per line (unset: hash only)",
    )
    env_flag(
        ver,
        "--admission-h",
        "GPUCOST_ADMISSION_H",
        int,
        "48",
        "hours an OTLP export must cover without a gap, up to each GPU's latest window",
    )
    otlp = hsub.add_parser(
        "export-otlp",
        help="the health figures as OpenTelemetry metrics (OTLP/HTTP protobuf), each point at its window's event time",
    )
    add_out(otlp, "output directory holding the health records")
    env_flag(
        otlp,
        "--endpoint",
        "GPUCOST_OTLP_ENDPOINT",
        str,
        None,
        "the receiver's OTLP/HTTP metrics URL, e.g. http://collector:4318/v1/metrics",
    )
    otlp.add_argument("--json", type=Path, help="also write the request as OTLP JSON to this file")
    otlp.add_argument("--gpu", help="one GPU's windows only")


DISCOVERY = Command(
    "discovery",
    "the nodes in service as a Prometheus file_sd file, from the health "
    "records (removed or probation GPUs take their node out)",
    _discovery_arguments,
    cmd_discovery,
)
RECLAIM = Command(
    "reclaim",
    "act on reclaim triggers once each: POST them to a webhook and/or write "
    "them to a file (from the Kafka reclaim topic, or once from --out)",
    _reclaim_arguments,
    cmd_reclaim,
)
HEALTH = Command(
    "health", "health snapshots for admission: write a GPU's latest, or verify one", _health_arguments, cmd_health
)
