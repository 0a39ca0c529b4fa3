"""The tenant's relay to its nodes on the verifier's tenant API
(:mod:`verifier.protocol.messages.relay`): the tenant asks for the
identity quote and hands U over here, with nothing but its Keystone token,
in both modes. A push node's agent gets them in the answers to its pushed
evidence; a polled node's agent from the verifier on its own mTLS
connection, while the tenant's request waits (so for a polled node the
``POST`` already holds the outcome).

``POST /v1/nodes/{uuid}/relay/identity``           ask (tenant nonce)
``GET  /v1/nodes/{uuid}/relay/identity?nonce=HEX`` the agent's answer
``POST /v1/nodes/{uuid}/relay/u``                  U sealed to NK (opaque)
``GET  /v1/nodes/{uuid}/relay/u``                  what became of it

Only the node's project (or an operator) may use them; another project's
node is 404 ``unknown_node``, as everywhere else on this API. An agent
that does not answer is 502 ``agent_unreachable``; a polled agent's
identity quote that is not by its AK over the tenant's nonce is 502
``identity_not_over_nonce`` (nothing is kept).
"""

from __future__ import annotations

from aiohttp import web

from verifier.api.authz import caller, rule
from verifier.attest.push import PushAttestation
from verifier.common.errors import unknown_node
from verifier.common.web import json_response, parse_json_body
from verifier.exceptions import RequestError
from verifier.protocol import canonical_uuid
from verifier.protocol.messages.relay import IdentityAsk
from verifier.protocol.messages.shares import MAX_PAYLOAD_ENVELOPE, ShareU
from verifier.protocol.relay import RelayError

__all__ = ["RELAY_ERROR_STATUS", "add_routes"]

_KEY = web.AppKey("relay_push", PushAttestation)
#: The HTTP status of each refusal.
RELAY_ERROR_STATUS = {
    "wrong_project": 404,
    "identity_not_over_nonce": 502,
    "not_asked": 404,
    "u_not_posted": 404,
    "u_already_posted": 409,
    "u_malformed": 400,
}
#: A relayed U carries the sealed payload: base64 of up to 16 MiB + slack.
_MAX_U_BODY = 4 * (MAX_PAYLOAD_ENVELOPE // 3 + 2) + 4096


def _refused(exc: RelayError, uuid: str) -> RequestError:
    if exc.code == "wrong_project":  # as if it did not exist
        return unknown_node(canonical_uuid(uuid))
    return RequestError(exc.code, exc.detail, RELAY_ERROR_STATUS.get(exc.code, 400))


async def _body(request: web.Request, limit: int) -> bytes:
    """The request body up to ``limit`` bytes (the tenant API's own limit
    is for small bodies; a U carries the payload)."""
    if request.content_length is not None and request.content_length > limit:
        raise RequestError("too_large", f"the body exceeds {limit} bytes", 413)
    body = await request.content.read(limit + 1)
    while len(body) <= limit:
        more = await request.content.read(limit + 1 - len(body))
        if not more:
            break
        body += more
    if len(body) > limit:
        raise RequestError("too_large", f"the body exceeds {limit} bytes", 413)
    return body


@rule("attestation:node:relay")
async def _ask_identity(request: web.Request) -> web.Response:
    ask = IdentityAsk.from_dict(parse_json_body(await _body(request, 4096)))
    try:
        await request.app[_KEY].relay.ask_identity(
            request.match_info["uuid"], caller(request).scope, ask.request
        )
    except RelayError as exc:
        raise _refused(exc, request.match_info["uuid"]) from None
    return json_response({"state": "asked"}, status=202)


@rule("attestation:node:relay")
async def _identity(request: web.Request) -> web.Response:
    try:
        nonce = bytes.fromhex(request.query.get("nonce", ""))
    except ValueError:
        raise RequestError("bad_nonce", "nonce must be hex") from None
    try:
        relayed = request.app[_KEY].relay.identity(
            request.match_info["uuid"], caller(request).scope, nonce
        )
    except RelayError as exc:
        raise _refused(exc, request.match_info["uuid"]) from None
    return json_response(relayed.to_dict())


@rule("attestation:node:relay")
async def _post_u(request: web.Request) -> web.Response:
    share = ShareU.from_dict(parse_json_body(await _body(request, _MAX_U_BODY)))
    try:
        status = await request.app[_KEY].relay.post_u(
            request.match_info["uuid"], caller(request).scope, share
        )
    except RelayError as exc:
        raise _refused(exc, request.match_info["uuid"]) from None
    return json_response(status.to_dict(), status=202)


@rule("attestation:node:relay")
async def _u_status(request: web.Request) -> web.Response:
    try:
        status = request.app[_KEY].relay.u_status(
            request.match_info["uuid"], caller(request).scope
        )
    except RelayError as exc:
        raise _refused(exc, request.match_info["uuid"]) from None
    return json_response(status.to_dict())


def add_routes(app: web.Application, push: PushAttestation) -> None:
    """Add the relay routes to the verifier's tenant API."""
    app[_KEY] = push
    base = "/v1/nodes/{uuid}/relay"
    app.router.add_post(f"{base}/identity", _ask_identity)
    app.router.add_get(f"{base}/identity", _identity)
    app.router.add_post(f"{base}/u", _post_u)
    app.router.add_get(f"{base}/u", _u_status)
