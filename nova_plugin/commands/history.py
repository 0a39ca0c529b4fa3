"""``trusted-tenant history`` and ``trusted-tenant checkpoint``: a node's
attestation log history, checked online against the checkpoint the
verifier serves, or offline (``--verify FILE``) against a checkpoint the
tenant kept, with nothing but the verifier's event key
(:mod:`nova_plugin.loghistory`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
from typing import Any

from nova_plugin.commands.base import Command, LocalCommand, TenantCommand, readable
from nova_plugin.exceptions import UsageError
from nova_plugin.loghistory import (
    VerifiedHistory,
    open_note,
    read_key,
    seconds,
    since_time,
    verify_saved,
)
from nova_plugin.tenant import Tenant
from verifier.protocol import MalformedError, canonical_uuid

__all__ = ["Checkpoint", "History", "VerifyHistory"]


def _read(option: str, path: str) -> bytes:
    readable(option, path)
    with open(path, "rb") as handle:
        return handle.read()


def _write(path: str, data: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(data)


def history_lines(result: Any) -> list[str]:
    """The verified history as a table, and what was verified."""
    lines = [f"{'time':20}  {'kind':14}  {'reason':18}  detail"]
    for entry in result["entries"]:
        when = datetime.datetime.fromtimestamp(entry["created_at"], datetime.UTC)
        lines.append(
            f"{when:%Y-%m-%dT%H:%M:%SZ}  {entry['kind']:14}  "
            f"{entry['reason']:18}  {entry['detail']}"
        )
    summary = (
        f"verified: {len(result['entries'])} entries included in tree of size "
        f"{result['tree_size']}"
    )
    if result["kept_size"] is not None:
        summary += f", consistent with your checkpoint of size {result['kept_size']}"
    if result["complete_from"]:
        summary += f" (history complete from leaf {result['complete_from']} on)"
    return [*lines, summary]


class VerifyHistory(LocalCommand):
    """``history --verify FILE``: the offline check (no network)."""

    name = "history"
    help = "verify a saved history offline"

    def run(self, args: argparse.Namespace) -> dict[str, Any]:
        if not args.checkpoint or not args.event_key:
            raise UsageError("--verify needs --checkpoint KEPT.note and --key PEM")
        try:
            saved = json.loads(_read("--verify", args.verify))
        except (ValueError, UnicodeDecodeError):
            raise UsageError(f"--verify {args.verify}: not JSON") from None
        if not isinstance(saved, dict):
            raise UsageError(f"--verify {args.verify}: not a saved history")
        key = read_key(_read("--key", args.event_key), f"--key {args.event_key}")
        kept = _read("--checkpoint", args.checkpoint).decode("utf-8", "replace")
        verified = verify_saved(saved, key, kept)
        _same_node(args, verified)
        return verified.to_dict()

    def lines(self, result: Any) -> list[str]:
        return history_lines(result)


def _same_node(args: argparse.Namespace, verified: VerifiedHistory) -> None:
    try:
        asked = canonical_uuid(args.uuid) if args.uuid else verified.node_uuid
    except MalformedError:
        raise UsageError(f"history: {args.uuid!r} is not a UUID") from None
    if asked != verified.node_uuid:
        raise UsageError(f"the saved history is node {verified.node_uuid}'s")


class History(TenantCommand):
    """``history UUID``: fetch a node's history and verify it online."""

    name = "history"
    help = "show a node's verified attestation log history"
    offline = VerifyHistory()

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("uuid", nargs="?", help="the node")
        parser.add_argument(
            "--since", help="from this time on: a duration ago (1h, 2d) or ISO 8601"
        )
        parser.add_argument("--until", help="up to this time (ISO 8601)")
        parser.add_argument(
            "--output", help="save the history and its proofs here (for --verify)"
        )
        parser.add_argument(
            "--checkpoint",
            help="a checkpoint you kept (trusted-tenant checkpoint --output): "
            "the log must extend it",
        )
        parser.add_argument(  # not the global --key (the TLS key)
            "--key",
            dest="event_key",
            metavar="EVENT_KEY.pem",
            help="the verifier's event key (PEM); online, default: the one the "
            "verifier serves",
        )
        parser.add_argument(
            "--verify",
            metavar="FILE",
            help="verify a saved history offline (with --checkpoint and --key)",
        )

    def resolve(self, args: argparse.Namespace) -> Command:
        return self.offline if args.verify else self

    def check(self, args: argparse.Namespace) -> None:
        if not args.uuid:
            raise UsageError("history: give the node's UUID (or --verify FILE)")
        try:
            canonical_uuid(args.uuid)
        except MalformedError:
            raise UsageError(f"history: {args.uuid!r} is not a UUID") from None
        for option, dest in (("checkpoint", "checkpoint"), ("key", "event_key")):
            if getattr(args, dest):
                readable(f"--{option}", getattr(args, dest))

    async def run(self, tenant: Tenant, args: argparse.Namespace) -> Any:
        since = since_time(args.since, time.time()) if args.since else None
        until = since_time(args.until, time.time()) if args.until else None
        answer = await tenant.history(args.uuid, since, until)
        if args.event_key:
            key = read_key(_read("--key", args.event_key), f"--key {args.event_key}")
        else:
            served = await tenant.log_checkpoint()
            key = read_key(str(served.get("key", "")).encode(), "the served key")
        kept_note, consistency = None, None
        if args.checkpoint:
            kept_note = _read("--checkpoint", args.checkpoint).decode(
                "utf-8", "replace"
            )
            kept = open_note(kept_note, key)
            size = answer.get("tree_size")
            if isinstance(size, int) and size >= kept.size:
                consistency = await tenant.log_consistency(kept.size, size)
            else:  # a smaller tree than the kept one: refused as forked
                consistency = {"from": kept.size, "to": size, "proof": []}
        saved = {
            "history": answer,
            "consistency": consistency,
            "since": seconds(since) if since else None,
            "until": bool(until),
        }
        if args.output:
            _write(args.output, json.dumps(saved, indent=1, sort_keys=True))
        return verify_saved(saved, key, kept_note).to_dict()

    def lines(self, result: Any) -> list[str]:
        return history_lines(result)


class Checkpoint(TenantCommand):
    """``checkpoint``: the log's latest signed checkpoint, to keep."""

    name = "checkpoint"
    help = "fetch (and keep) the attestation log's signed checkpoint"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--output", help="keep the checkpoint note here")
        parser.add_argument(
            "--key-output", help="keep the verifier's event key (PEM) here"
        )

    async def run(self, tenant: Tenant, args: argparse.Namespace) -> Any:
        served = await tenant.log_checkpoint()
        note, pem = str(served.get("checkpoint", "")), str(served.get("key", ""))
        checkpoint = open_note(note, read_key(pem.encode(), "the served key"))
        if args.output:
            _write(args.output, note)
        if args.key_output:
            _write(args.key_output, pem)
        return {
            "origin": checkpoint.origin,
            "size": checkpoint.size,
            "checkpoint": note,
        }

    def lines(self, result: Any) -> list[str]:
        return [
            f"checkpoint of {result['origin']}: size {result['size']}",
            *result["checkpoint"].rstrip("\n").splitlines(),
        ]
