"""Monitor attestation endpoints of the verifier (Excalibur's "monitor
attestation"): a customer checks the verifier host's integrity.

``GET /v1/monitor/attest?nonce=HEX``   a batched quote over the nonce
``POST /v1/monitor/attest {nonce}``    the same, nonce in a JSON body
``GET /v1/monitor/ak``                 the host AK, EK and EK certificate
``POST /v1/monitor/activate``          TPM2_ActivateCredential for a
                                       customer's MakeCredential challenge
"""

from __future__ import annotations

from aiohttp import web

from verifier.attest.monitor import HostTpm, MonitorBatcher
from verifier.common.web import allow, b64, b64_field, json_response, read_json
from verifier.exceptions import RequestError
from verifier.protocol import TpmPublic

__all__ = ["add_monitor_routes"]

_BATCHER = web.AppKey("monitor_batcher", MonitorBatcher)
_HOST = web.AppKey("monitor_host", HostTpm)


def _nonce(text: object) -> bytes:
    if not isinstance(text, str) or len(text) > 128:
        raise RequestError("bad_field", "'nonce' must be 16 to 64 bytes in hex")
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise RequestError("bad_field", "'nonce' is not hex")


@allow("monitor")
async def _attest_get(request: web.Request) -> web.Response:
    nonce = _nonce(request.query.get("nonce"))
    reply = await request.app[_BATCHER].attest(nonce)
    return json_response(reply.to_dict())


@allow("monitor")
async def _attest_post(request: web.Request) -> web.Response:
    nonce = _nonce((await read_json(request)).get("nonce"))
    reply = await request.app[_BATCHER].attest(nonce)
    return json_response(reply.to_dict())


@allow("monitor")
async def _ak(request: web.Request) -> web.Response:
    host = request.app[_HOST]
    ak, ek, ek_cert = await host.identity()
    return json_response(
        {
            "ak_public": b64(ak),
            "ak_name": TpmPublic.from_bytes(ak).name.hex(),
            "ek_public": b64(ek),
            "ek_certificate": b64(ek_cert) if ek_cert else None,
            "pcrs": host.pcrs,
        }
    )


@allow("monitor")
async def _activate(request: web.Request) -> web.Response:
    data = await read_json(request)
    blob = b64_field(data, "credential_blob", max_len=1024) or b""
    secret = b64_field(data, "encrypted_secret", max_len=1024) or b""
    credential = await request.app[_HOST].activate(blob, secret)
    return json_response({"credential": b64(credential)})


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
