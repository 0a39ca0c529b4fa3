"""Many enrolled nodes in a verifier database, and a verifier service on
them that sends nothing: for the benchmarks that measure the verifier at
scale in one process (tools/bench/memory.py, policy_follow.py)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from sqlalchemy.engine import Engine

from trusted_testing.softtpm import AK_ATTRIBUTES
from verifier.attest.service import Verifier
from verifier.attest.settings import VerifierSettings
from verifier.notify import Outbox
from verifier.protocol import tpm as t

_CERT = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


class Silent:
    """An agent and registrar client whose requests never finish (no
    traffic at all)."""

    async def call(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.Event().wait()

    def forget(self, base: str, agent_cert: str) -> None:
        pass

    def rest(self, base: str, delay: float) -> None:
        pass

    async def placement(self, uuid: str) -> str | None:
        return None

    async def get_agent(self, uuid: str) -> Any:
        raise AssertionError("not used")

    async def close(self) -> None:
        pass


def ecc_ak() -> bytes:
    """A fresh ECC P-256 AK's TPM2B_PUBLIC, as a software TPM makes it."""
    key = ec.generate_private_key(ec.SECP256R1()).public_key()
    return t.make_public(key, AK_ATTRIBUTES, (t.ALG_ECDSA, t.ALG_SHA256)).to_bytes()


def attested_row(
    i: int, policy: str, ak_public: bytes, now: float, **more: Any
) -> dict[str, Any]:
    """The ``nodes`` row of the ``i``-th attested node (its own UUID and
    loopback address) under the PCR policy JSON ``policy``; ``more``
    columns added."""
    return {
        "uuid": f"00000000-0000-4000-8000-{i:012d}",
        "state": "attested",
        "policy": policy,
        "v_share": os.urandom(32),
        "ak_public": ak_public,
        "tls_cert": _CERT,
        "host": f"127.2.{i // 250}.{i % 250 + 1}",
        "port": 9,
        "reset_count": 0,
        "restart_count": 0,
        "clock": 1000,
        "quotes_verified": 1,
        "v_released": True,
        "created_at": now,
        "updated_at": now,
        **more,
    }


def silent_verifier(engine: Engine, interval: float) -> Verifier:
    """The real verifier service on ``engine``, its agents and registrar
    never answering and no notifier."""
    return Verifier(
        engine,
        ed25519.Ed25519PrivateKey.generate(),
        Silent(),  # type: ignore[arg-type]
        Silent(),  # type: ignore[arg-type]
        Outbox(engine, []),
        None,
        VerifierSettings(interval=interval),
    )
