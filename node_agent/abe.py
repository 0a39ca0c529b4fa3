"""Policy-sealed data on the node: CP-ABE keys and unsealing.

The verifier posts the node a CP-ABE key for its attested attributes after
a valid quote, sealed to the node's transport key NK (``POST
/v1/keys/abe``); a new epoch (after some node's revocation) brings a new
key. The node keeps every key it was given: data sealed under an older
epoch stays readable to it. A tenant posts a policy-sealed blob (``POST
/v1/sealed``); the agent opens it with the newest key that satisfies the
policy and stores the plaintext (0600) under ``work_dir/sealed/``.

``POST /v1/keys/abe``  ``{"key": b64, "params": b64, "epoch": n}`` (verifier)
``POST /v1/sealed``    ``{"blob": b64}`` (tenant)
``GET  /v1/abe``       the epochs and attributes of the keys held

The request bodies are ``AbeKeyDelivery`` and ``SealedBlobRequest`` of
:mod:`verifier.protocol.messages.abe`.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from typing import Any

from aiohttp import web

from node_agent.agent import Agent
from node_agent.exceptions import RefusedError
from node_agent.payload import write_file
from verifier.common.web import allow, json_response, read_json
from verifier.protocol import ShareKind
from verifier.protocol.abe import (
    PublicParams,
    SealedBlob,
    SecretKey,
    parse_policy,
    satisfies,
    unseal,
)
from verifier.protocol.messages.abe import AbeKeyDelivery, SealedBlobRequest

__all__ = ["AbeKeyring", "add_abe_routes", "keyring_of"]

SEALED_DIR = "sealed"


class AbeKeyring:
    """The CP-ABE keys this node was issued (memory only, like NK).

    Args:
        agent: the node agent (its NK opens the key envelopes).
    """

    def __init__(self, agent: Agent) -> None:
        self._agent = agent
        self._pp: PublicParams | None = None
        self._keys: list[tuple[int, SecretKey]] = []

    def receive(self, envelope: bytes, params: bytes, epoch: int) -> None:
        """Accept a key from the verifier.

        Raises:
            EnvelopeError: not sealed to this node's NK.
            MalformedError: the key or parameters do not decode.
            RefusedError: ``abe_key_mismatch`` (key for other parameters).
        """
        sk = SecretKey.from_bytes(self._agent.open_transport(ShareKind.ABE, envelope))
        pp = PublicParams.from_bytes(params)
        if sk.pp_id != pp.id:
            raise RefusedError("abe_key_mismatch", "key is for other public parameters")
        if self._pp is None or self._pp.id != pp.id:
            self._pp, self._keys = pp, []  # a new authority replaces the old
        if all(k.to_bytes() != sk.to_bytes() for _, k in self._keys):
            self._keys.append((epoch, sk))
            self._keys.sort(key=lambda item: item[0])

    def describe(self) -> dict[str, Any]:
        return {
            "params_id": self._pp.id.hex() if self._pp else None,
            "keys": [
                {
                    "epoch": e,
                    "attributes": sorted(str(a) for a in k.attributes),
                    # names the key (same configuration, same key), not secret
                    "fingerprint": hashlib.sha256(k.to_bytes()).hexdigest()[:16],
                }
                for e, k in self._keys
            ],
        }

    def open(self, blob: bytes) -> bytes:
        """Unseal with the newest key whose attributes satisfy the policy.

        Raises:
            MalformedError: the blob does not decode.
            RefusedError: ``no_abe_key`` (409), ``other_params`` (400) or
                ``policy_not_satisfied`` (403).
            SealIntegrityError: a satisfying key does not open it (tampering).
        """
        ct = SealedBlob.from_bytes(blob).ciphertext
        if self._pp is None or not self._keys:
            raise RefusedError("no_abe_key", "this node holds no CP-ABE key yet", 409)
        if ct.pp_id != self._pp.id:
            raise RefusedError(
                "other_params", "sealed under other public parameters than our keys"
            )
        tree = parse_policy(ct.policy)
        for _, sk in reversed(self._keys):
            if satisfies(tree, sk.attributes):
                return unseal(self._pp, sk, blob)
        raise RefusedError(
            "policy_not_satisfied",
            "this node's attested attributes do not satisfy the sealing policy",
            403,
        )

    def store(self, plaintext: bytes, blob: bytes) -> str:
        """Write an opened payload (0600); its path."""
        directory = os.path.join(self._agent.work_dir, SEALED_DIR)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        path = os.path.join(directory, hashlib.sha256(blob).hexdigest()[:32])
        write_file(path, plaintext, 0o600)
        return path


_KEYRING = web.AppKey("abe_keyring", AbeKeyring)


@allow("verifier")
async def _keys_abe(request: web.Request) -> web.Response:
    body = AbeKeyDelivery.from_dict(await read_json(request))
    request.app[_KEYRING].receive(body.key, body.params, body.epoch)
    return json_response({"accepted": "abe", "epoch": body.epoch})


@allow("tenant")
async def _sealed(request: web.Request) -> web.Response:
    blob = SealedBlobRequest.from_dict(await read_json(request)).blob
    keyring = request.app[_KEYRING]
    plaintext = await asyncio.to_thread(keyring.open, blob)
    path = await asyncio.to_thread(keyring.store, plaintext, blob)
    return json_response(
        {
            "opened": True,
            "path": path,
            "sha256": hashlib.sha256(plaintext).hexdigest(),
        }
    )


@allow("tenant", "verifier")
async def _abe_status(request: web.Request) -> web.Response:
    return json_response(request.app[_KEYRING].describe())


def keyring_of(app: web.Application) -> AbeKeyring | None:
    """The keyring of an agent application with the CP-ABE routes (push
    mode hands it the keys that come with the verifier's answers)."""
    return app.get(_KEYRING)


def add_abe_routes(app: web.Application, agent: Agent) -> None:
    """Serve the CP-ABE key and sealed-payload endpoints for ``agent``."""
    app[_KEYRING] = AbeKeyring(agent)
    app.router.add_post("/v1/keys/abe", _keys_abe)
    app.router.add_post("/v1/sealed", _sealed)
    app.router.add_get("/v1/abe", _abe_status)
