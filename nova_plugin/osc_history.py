"""``openstack attestation node history``: a node's attestation log
history, verified online against the checkpoint the verifier serves (and
a checkpoint you kept), or offline with ``--verify FILE`` (no network:
:mod:`nova_plugin.loghistory`)."""

from __future__ import annotations

import argparse
import datetime
import json
import time
from typing import Any

from osc_lib import exceptions as osc_exceptions
from osc_lib.command import command

from nova_plugin.exceptions import TenantError
from nova_plugin.loghistory import (
    VerifiedHistory,
    open_note,
    read_key,
    seconds,
    since_time,
    verify_saved,
)

__all__ = ["NodeHistory"]

_COLUMNS = ("time", "kind", "reason", "detail")


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise osc_exceptions.CommandError(f"{path}: {exc.strerror or exc}")


class NodeHistory(command.Lister):
    """Show a node's verified attestation log history (every change of the
    verifier's word on it), each entry proved included in the verifier's
    signed log; with --checkpoint, the log is also proved to extend the
    checkpoint you kept."""

    def get_parser(self, prog_name: str) -> argparse.ArgumentParser:
        parser = super().get_parser(prog_name)
        parser.add_argument("uuid", metavar="<uuid>", nargs="?", help="the node")
        parser.add_argument("--since", help="a duration ago (1h, 2d) or ISO 8601")
        parser.add_argument("--until", help="ISO 8601")
        parser.add_argument("--output", help="save the history and its proofs")
        parser.add_argument("--checkpoint", help="a checkpoint note you kept")
        parser.add_argument("--key", help="the verifier's event key (PEM)")
        parser.add_argument(
            "--verify", metavar="FILE", help="verify a saved history offline"
        )
        return parser

    def take_action(self, parsed_args: argparse.Namespace) -> Any:
        try:
            verified = self._verified(parsed_args)
        except TenantError as exc:
            raise osc_exceptions.CommandError(str(exc))
        summary = (
            f"verified: {len(verified.entries)} entries included in tree of "
            f"size {verified.tree_size}"
        )
        if verified.kept_size is not None:
            summary += f", consistent with your checkpoint of size {verified.kept_size}"
        self.app.stderr.write(summary + "\n")
        rows = [
            (
                datetime.datetime.fromtimestamp(e.created_at, datetime.UTC).strftime(
                    "%Y-%m-%dT%H:%M:%SZ"
                ),
                e.kind.value,
                e.reason,
                e.detail,
            )
            for e in verified.entries
        ]
        return _COLUMNS, rows

    def _verified(self, args: argparse.Namespace) -> VerifiedHistory:
        kept = (
            _read(args.checkpoint).decode("utf-8", "replace")
            if args.checkpoint
            else None
        )
        if args.verify:
            if kept is None or not args.key:
                raise osc_exceptions.CommandError(
                    "--verify needs --checkpoint and --key"
                )
            try:
                saved = json.loads(_read(args.verify))
            except ValueError:
                raise osc_exceptions.CommandError(f"{args.verify}: not JSON")
            return verify_saved(saved, read_key(_read(args.key), args.key), kept)
        if not args.uuid:
            raise osc_exceptions.CommandError("give the node's UUID (or --verify FILE)")
        client = self.app.client_manager.attestation  # type: ignore[attr-defined]
        now = time.time()
        since = since_time(args.since, now) if args.since else None
        until = since_time(args.until, now) if args.until else None
        answer = client.history(args.uuid, since, until)
        if args.key:
            key = read_key(_read(args.key), args.key)
        else:
            pem = str(client.log_checkpoint().get("key", ""))
            key = read_key(pem.encode(), "the served key")
        consistency = None
        if kept is not None:
            size, old = answer.get("tree_size"), open_note(kept, key).size
            if isinstance(size, int) and size >= old:
                consistency = client.log_consistency(old, size)
            else:  # a smaller tree than the kept one: refused as forked
                consistency = {"from": old, "to": size, "proof": []}
        saved = {
            "history": answer,
            "consistency": consistency,
            "since": seconds(since) if since else None,
            "until": bool(until),
        }
        if args.output:
            with open(args.output, "w", encoding="utf-8") as handle:
                json.dump(saved, handle, indent=1, sort_keys=True)
        return verify_saved(saved, key, kept)
