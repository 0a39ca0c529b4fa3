"""The verifier's push endpoint: node agents that cannot be polled post
their evidence here (:mod:`verifier.protocol.messages.push`).

``POST /v1/push/{uuid}/session``        a nonce to open a session with
``POST /v1/push/{uuid}/session/proof``  a quote over it -> a session token
``POST /v1/push/{uuid}/challenge``      the next challenge (token)
``POST /v1/push/{uuid}/evidence``       evidence for it (token)

Agents authenticate by their TPM, not by a certificate: this application
is served on its own port (``[verifier] push_port``) with server-only TLS,
and a request is allowed by its session (a quote by the node's activated
AK), never by a role. Refusals are the shared JSON error body with a 4xx
status per :class:`~verifier.protocol.push.PushError` code.
"""

from __future__ import annotations

from aiohttp import web

from verifier.attest.push import PushAttestation
from verifier.common import openapi
from verifier.common.web import (
    Handler,
    error_middleware,
    json_response,
    parse_json_body,
    read_json,
)
from verifier.exceptions import RequestError
from verifier.protocol.messages.push import EvidencePost, SessionProof
from verifier.protocol.push import PushError

__all__ = ["PUSH_ERROR_STATUS", "make_push_app"]

_KEY = web.AppKey("push", PushAttestation)
_SCHEME = "TPM-Session "
#: The HTTP status of each refusal.
PUSH_ERROR_STATUS = {
    "no_session": 401,
    "session_expired": 401,
    "bad_session_proof": 401,
    "ak_not_activated": 403,
    "wrong_node": 403,
    "unknown_challenge": 404,
    "challenge_used": 409,
    "challenge_expired": 410,
    "evidence_too_large": 413,
    "too_frequent": 429,
}


@web.middleware
async def _refusals(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except PushError as exc:
        raise RequestError(
            exc.code, exc.detail, PUSH_ERROR_STATUS.get(exc.code, 400)
        ) from exc


def _token(request: web.Request) -> str:
    header = request.headers.get("Authorization", "")
    if not header.startswith(_SCHEME) or len(header) > 256:
        raise RequestError(
            "no_session", f"send 'Authorization: {_SCHEME}<token>' of a session", 401
        )
    return header[len(_SCHEME) :].strip()


async def _session(request: web.Request) -> web.Response:
    nonce = request.app[_KEY].open_session(request.match_info["uuid"])
    return json_response(nonce.to_dict(), status=201)


async def _proof(request: web.Request) -> web.Response:
    proof = SessionProof.from_dict(await read_json(request))
    grant = request.app[_KEY].prove_session(request.match_info["uuid"], proof)
    return json_response(grant.to_dict(), status=201)


async def _challenge(request: web.Request) -> web.Response:
    push = request.app[_KEY]
    challenge = push.challenge(request.match_info["uuid"], _token(request))
    return json_response(challenge.to_dict(), status=201)


async def _evidence(request: web.Request) -> web.Response:
    push = request.app[_KEY]
    token = _token(request)
    limit = push.rules.max_evidence_bytes
    if request.content_length is not None and request.content_length > limit:
        raise PushError("evidence_too_large", f"evidence exceeds {limit} bytes")
    body = await request.read()
    if len(body) > limit:
        raise PushError("evidence_too_large", f"evidence exceeds {limit} bytes")
    post = EvidencePost.from_dict(parse_json_body(body))
    result = push.evidence(request.match_info["uuid"], token, post, len(body))
    return json_response(result.to_dict())


def make_push_app(push: PushAttestation) -> web.Application:
    """The push endpoint's aiohttp application (TLS is up to the site)."""
    app = web.Application(
        middlewares=[error_middleware, _refusals],
        client_max_size=push.rules.max_evidence_bytes + 1,
    )
    app[_KEY] = push
    app.router.add_post("/v1/push/{uuid}/session", _session)
    app.router.add_post("/v1/push/{uuid}/session/proof", _proof)
    app.router.add_post("/v1/push/{uuid}/challenge", _challenge)
    app.router.add_post("/v1/push/{uuid}/evidence", _evidence)
    openapi.add_route(app, "trusted-cloud verifier push endpoint")
    return app
