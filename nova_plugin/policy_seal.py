"""Sealing a payload to a policy over node attributes (Excalibur).

Instead of one node's key shares, the tenant seals to a policy such as
``region=eu and hv=kvm-9``: every node the verifier attested whose
provider-known attributes satisfy it can open the payload, including nodes
booted later, and no other. The tenant fetches the verifier's public
parameters, key epoch and its own project as the verifier labels it, seals
to ``(policy) and epoch=<n> and project=<p>`` (so nodes revoked before now
cannot open it, nor any node of another project: the verifier puts each
node's project in its key), and hands the blob to nodes (or stores it
anywhere: it is ciphertext).

Sealing needs the ``abe`` extra (pymcl); handing a sealed blob to a node
does not, so this module imports the CP-ABE code only when it seals.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nova_plugin.exceptions import ServiceError
from nova_plugin.tenant import Tenant
from verifier.common import extras
from verifier.protocol import MalformedError
from verifier.protocol.messages.abe import AbeParams, SealedBlobRequest

__all__ = ["fetch_params", "seal_to_policy", "sealed_policy", "send_sealed"]


async def fetch_params(tenant: Tenant) -> AbeParams:
    """The verifier's CP-ABE public parameters, current key epoch and the
    caller's project.

    Raises:
        MissingExtraError: the ``abe`` extra is not installed.
        ServiceError: unreachable, not enabled, or a malformed answer.
    """
    extras.require("abe", "sealing to a policy")
    data = await tenant.request("GET", tenant.verifier_url + "/v1/abe/params")
    try:
        answer = AbeParams.from_dict(data)
    except MalformedError as exc:
        raise ServiceError(f"the verifier sent malformed CP-ABE parameters: {exc}")
    return answer


def seal_to_policy(params: AbeParams, policy: str, payload: bytes) -> bytes:
    """Seal ``payload`` to ``policy`` for the nodes of ``params.project``
    keyed in ``params.epoch`` or later.

    Raises:
        MissingExtraError: the ``abe`` extra is not installed.
        PolicyError: the policy does not parse (with the position).
        MalformedError: it names a reserved attribute (``epoch``,
            ``project``), or the verifier named no project.
    """
    extras.require("abe", "sealing to a policy")
    from verifier.protocol.abe import parse_policy, seal
    from verifier.protocol.abe.policy import leaves

    tree = parse_policy(policy)
    for leaf in leaves(tree):
        if leaf.name in ("epoch", "project"):
            raise MalformedError(
                "policy", f"{leaf.name!r} is added by the tenant tool itself"
            )
    if not params.project:
        raise MalformedError(
            "ABE parameters", "the verifier named no project for this caller"
        )
    return seal(params.params, sealed_policy(params, policy), payload)


def sealed_policy(params: AbeParams, policy: str) -> str:
    """The policy a payload is sealed to: ``policy`` narrowed to the key
    epoch and the caller's project."""
    return f"({policy}) and epoch={params.epoch} and project={params.project}"


async def send_sealed(tenant: Tenant, uuid: str, blob: bytes) -> Mapping[str, Any]:
    """Hand a sealed blob to a node, which opens it if its key satisfies
    the policy.

    Raises:
        ServiceError: the node refused (``policy_not_satisfied``,
            ``no_abe_key``) or is unreachable.
    """
    return await tenant.agent_request(
        uuid, "POST", "/v1/sealed", SealedBlobRequest(blob).to_dict()
    )
