"""Monitor attestation endpoints of the verifier (Excalibur's "monitor
attestation"): a customer checks the verifier host's integrity.

``GET /v1/monitor/attest?nonce=HEX``   a batched quote over the nonce
``POST /v1/monitor/attest {nonce}``    the same, nonce in a JSON body
``GET /v1/monitor/ak``                 the host AK, EK and EK certificate
``POST /v1/monitor/activate``          TPM2_ActivateCredential for a
                                       customer's MakeCredential challenge

The bodies are the classes of :mod:`verifier.protocol.messages.monitor` and
:mod:`verifier.protocol.messages.registration` (the activation).
"""

from __future__ import annotations

from aiohttp import web

from verifier.api.authz import rule
from verifier.attest.monitor import HostTpm, MonitorBatcher
from verifier.common.web import json_response, read_json
from verifier.protocol import TpmPublic
from verifier.protocol.messages.monitor import MonitorChallenge, MonitorIdentity
from verifier.protocol.messages.registration import (
    ActivationChallenge,
    ActivationProof,
)

__all__ = ["add_monitor_routes"]

_BATCHER = web.AppKey("monitor_batcher", MonitorBatcher)
_HOST = web.AppKey("monitor_host", HostTpm)


@rule("attestation:monitor:attest")
async def _attest_get(request: web.Request) -> web.Response:
    challenge = MonitorChallenge.from_dict({"nonce": request.query.get("nonce")})
    reply = await request.app[_BATCHER].attest(challenge.nonce)
    return json_response(reply.to_dict())


@rule("attestation:monitor:attest")
async def _attest_post(request: web.Request) -> web.Response:
    challenge = MonitorChallenge.from_dict(await read_json(request))
    reply = await request.app[_BATCHER].attest(challenge.nonce)
    return json_response(reply.to_dict())


@rule("attestation:monitor:attest")
async def _ak(request: web.Request) -> web.Response:
    host = request.app[_HOST]
    ak, ek, ek_cert = await host.identity()
    identity = MonitorIdentity(
        TpmPublic.from_bytes(ak), TpmPublic.from_bytes(ek), ek_cert, tuple(host.pcrs)
    )
    return json_response(identity.to_dict())


@rule("attestation:monitor:attest")
async def _activate(request: web.Request) -> web.Response:
    challenge = ActivationChallenge.from_dict(await read_json(request))
    credential = await request.app[_HOST].activate(
        challenge.credential_blob, challenge.encrypted_secret
    )
    return json_response(ActivationProof(credential).to_dict())


def add_monitor_routes(
    app: web.Application, batcher: MonitorBatcher, host: HostTpm
) -> None:
    """Serve monitor attestation from ``host`` through ``batcher``."""
    app[_BATCHER] = batcher
    app[_HOST] = host
    app.router.add_get("/v1/monitor/attest", _attest_get)
    app.router.add_post("/v1/monitor/attest", _attest_post)
    app.router.add_get("/v1/monitor/ak", _ak)
    app.router.add_post("/v1/monitor/activate", _activate)
