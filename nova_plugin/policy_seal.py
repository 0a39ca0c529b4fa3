"""Sealing a payload to a policy over node attributes (Excalibur).

Instead of one node's key shares, the tenant seals to a policy such as
``region=eu and hv=kvm-9``: every node the verifier attested whose
provider-known attributes satisfy it can open the payload, including nodes
booted later, and no other. The tenant fetches the verifier's public
parameters and key epoch, seals to ``(policy) and epoch=<n>`` (so nodes
revoked before now cannot open it), and hands the blob to nodes (or
stores it anywhere: it is ciphertext).

Sealing needs the ``abe`` extra (pymcl); handing a sealed blob to a node
does not, so this module imports the CP-ABE code only when it seals.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from nova_plugin.exceptions import ServiceError
from nova_plugin.tenant import Tenant
from verifier.common import extras
from verifier.protocol import MalformedError
from verifier.protocol.messages.abe import AbeParams, SealedBlobRequest

if TYPE_CHECKING:
    from verifier.protocol.abe import PublicParams

__all__ = ["fetch_params", "seal_to_policy", "send_sealed"]


async def fetch_params(tenant: Tenant) -> tuple[PublicParams, int]:
    """The verifier's CP-ABE public parameters and current key epoch.

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
    return answer.params, answer.epoch


def seal_to_policy(pp: PublicParams, epoch: int, policy: str, payload: bytes) -> bytes:
    """Seal ``payload`` to ``policy`` for nodes keyed in ``epoch`` or later.

    Raises:
        MissingExtraError: the ``abe`` extra is not installed.
        PolicyError: the policy does not parse (with the position), or it
            names the reserved ``epoch`` attribute.
    """
    extras.require("abe", "sealing to a policy")
    from verifier.protocol.abe import parse_policy, seal
    from verifier.protocol.abe.policy import leaves

    tree = parse_policy(policy)
    if any(leaf.name == "epoch" for leaf in leaves(tree)):
        raise MalformedError("policy", "'epoch' is added by the tenant tool itself")
    return seal(pp, f"({policy}) and epoch={epoch}", payload)


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
