"""The attestation log's API (issue 30; :mod:`verifier.tlog`).

``GET /v1/log/checkpoint``             the latest signed checkpoint (a C2SP
                                       signed note, text/plain; with
                                       ``format=json``: {"checkpoint": note,
                                       "key": the signer's public PEM})
``GET /v1/nodes/{uuid}/history``       a node's entries, each with its
                                       inclusion proof in that checkpoint's
                                       tree (``since``, ``until``: ISO 8601)
``GET /v1/log/consistency``            the consistency proof between two
                                       tree sizes (``from``, ``to``)

A project sees the history of its own nodes only (by the entries' project,
so a deleted node's history stays readable); another project's node is 404
as a node never enrolled.
"""

from __future__ import annotations

import asyncio
import base64
import datetime

from aiohttp import web

from verifier.api.authz import caller, rule
from verifier.common.web import json_response
from verifier.exceptions import RequestError
from verifier.protocol import canonical_uuid
from verifier.tlog.reads import LogReader

__all__ = ["add_routes", "parse_time"]

_KEY = web.AppKey("log_reader", LogReader)
_SIGNER = web.AppKey("log_signer_pem", str)


def parse_time(text: str, name: str) -> float:
    """An ISO 8601 time (UTC unless it names its offset) as seconds.

    Raises:
        RequestError: not such a time (400 naming ``name``).
    """
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise RequestError(name, f"{name} must be an ISO 8601 time, not {text!r}")
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return when.timestamp()


def _int(request: web.Request, name: str) -> int:
    text = request.query.get(name)
    if text is None or not text.isdigit() or len(text) > 19:
        raise RequestError(name, f"{name} must be a tree size (an integer >= 0)")
    return int(text)


@rule("attestation:log:checkpoint")
async def _checkpoint(request: web.Request) -> web.Response:
    note = await asyncio.to_thread(request.app[_KEY].checkpoint)
    if request.query.get("format") == "json":  # for JSON-only clients
        return json_response({"checkpoint": note, "key": request.app[_SIGNER]})
    return web.Response(text=note, content_type="text/plain", charset="utf-8")


@rule("attestation:node:history")
async def _history(request: web.Request) -> web.Response:
    uuid = canonical_uuid(request.match_info["uuid"])
    scope = caller(request).scope
    since = request.query.get("since")
    until = request.query.get("until")
    start = parse_time(since, "since") if since is not None else None
    end = parse_time(until, "until") if until is not None else None
    if start is not None and end is not None and end < start:
        raise RequestError("until", "until must not be before since")
    reader = request.app[_KEY]
    history = await asyncio.to_thread(reader.history, uuid, scope, start, end)
    return json_response(history.to_dict())


@rule("attestation:log:consistency")
async def _consistency(request: web.Request) -> web.Response:
    old, new = _int(request, "from"), _int(request, "to")
    proof = await asyncio.to_thread(request.app[_KEY].consistency, old, new)
    encoded = [base64.b64encode(item).decode() for item in proof]
    return json_response({"from": old, "to": new, "proof": encoded})


def add_routes(app: web.Application, reader: LogReader, signer_pem: str) -> None:
    """Serve the log's routes from ``reader``; ``signer_pem``: the public
    event key that signs the checkpoints."""
    app[_KEY] = reader
    app[_SIGNER] = signer_pem
    app.router.add_get("/v1/log/checkpoint", _checkpoint)
    app.router.add_get("/v1/log/consistency", _consistency)
    app.router.add_get("/v1/nodes/{uuid}/history", _history)
