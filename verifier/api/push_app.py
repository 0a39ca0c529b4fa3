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

from collections.abc import Callable, Mapping
from typing import Any

from verifier.attest.push import PushAttestation
from verifier.common.lean_server import LastAnswer, LeanApp, LeanHandler, Request
from verifier.common.web import parse_json_body
from verifier.exceptions import RequestError
from verifier.protocol.attestation.verdict import NodeState
from verifier.protocol.messages.push import EvidencePost, SessionProof
from verifier.protocol.push import PushError

__all__ = ["PUSH_ERROR_STATUS", "make_push_app"]

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
Answer = tuple[int, Any]


def _refusals(handler: Callable[[Request, str], Answer]) -> LeanHandler:
    """``handler`` for the ``{uuid}`` of its route, its PushError s
    answered with their status."""

    def serve(request: Request, params: Mapping[str, str]) -> Answer:
        try:
            return handler(request, params["uuid"])
        except PushError as exc:
            raise RequestError(
                exc.code, exc.detail, PUSH_ERROR_STATUS.get(exc.code, 400)
            ) from exc

    serve.__doc__ = handler.__doc__
    serve.__name__ = handler.__name__
    return serve


def _token(request: Request) -> str:
    header = request.headers.get("authorization", "")
    if not header.startswith(_SCHEME) or len(header) > 256:
        raise RequestError(
            "no_session", f"send 'Authorization: {_SCHEME}<token>' of a session", 401
        )
    return header[len(_SCHEME) :].strip()


def make_push_app(push: PushAttestation, keepalive: float | None = None) -> LeanApp:
    """The push endpoint (served by :func:`verifier.common.lean_server.serve`;
    TLS is up to the caller).

    ``keepalive`` is the server's (``[push] keepalive``): the answer that
    ends a node's round closes its connection when the node is told to come
    back later than that (or is revoked), as the verifier's own connection
    to a polled node whose interval exceeds ``agent_keep_alive`` is closed
    after each round: an idle connection is memory held for nothing.
    """
    limit = push.rules.max_evidence_bytes
    app = LeanApp(
        "trusted-cloud verifier push endpoint",
        limit,
        ("evidence_too_large", f"evidence exceeds {limit} bytes"),
    )

    def session(request: Request, uuid: str) -> Answer:
        """A nonce to open a push session with."""
        return 201, push.open_session(uuid).to_dict()

    def proof(request: Request, uuid: str) -> Answer:
        """A quote over the session nonce: the session token."""
        proof = SessionProof.from_dict(parse_json_body(request.body))
        return 201, push.prove_session(uuid, proof).to_dict()

    def challenge(request: Request, uuid: str) -> Answer:
        """The next challenge of the session's node."""
        return 201, push.challenge(uuid, _token(request)).to_dict()

    def evidence(request: Request, uuid: str) -> Answer:
        """Evidence answering a challenge: the node's verdict."""
        token = _token(request)
        post = EvidencePost.from_dict(parse_json_body(request.body))
        result = push.evidence(uuid, token, post, len(request.body))
        if result.next is None and (
            result.state == NodeState.REVOKED
            or (keepalive is not None and result.interval > keepalive)
        ):
            return LastAnswer(200, result.to_dict())  # the round is over
        return 200, result.to_dict()

    app.add("POST", "/v1/push/{uuid}/session", _refusals(session))
    app.add("POST", "/v1/push/{uuid}/session/proof", _refusals(proof))
    app.add("POST", "/v1/push/{uuid}/challenge", _refusals(challenge))
    app.add("POST", "/v1/push/{uuid}/evidence", _refusals(evidence))
    return app
