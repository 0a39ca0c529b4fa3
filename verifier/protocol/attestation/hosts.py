"""What a compute host's attestation means for the trusted compute pool
(issue 29): the host verdict a guest carries, whether its Placement
trait is wanted, whether a change of it marks the host's guests, and the
swtpm local CA digest its attested IMA list proves.

A host is a node of kind ``host`` judged by the ordinary
:class:`~verifier.protocol.attestation.NodeAttestation`; this module maps
its :class:`NodeState` to the pool's words:

- ``attested`` -> trusted (``True``): the trait is wanted;
- ``revoked`` -> untrusted (``False``): evidence against the host (or its
  revocation by the operator). Its guests are treated as compromised: a
  compromised host could read their vTPM state and memory;
- any other state (not attested yet, ``unreachable``, ``failed``) ->
  unknown (``None``): the trait goes, but nothing is known against the
  host, so its guests are not marked. Silence is not evidence, even when
  it lasts long enough to revoke the host (``unreachable_timeout``).

Pure: no I/O, no clock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from verifier.protocol.attestation.verdict import NodeState
from verifier.protocol.ima.log import ImaEntry

__all__ = [
    "HOST_UNTRUSTED",
    "HostVerdict",
    "host_trusted",
    "proven_file_digest",
]

#: The reason (and shown state) of a guest whose host was found untrusted.
HOST_UNTRUSTED = "host_untrusted"


#: Revocation reasons that are silence, not evidence (the unreachable
#: action ``revoke``, or silence past ``unreachable_timeout``).
_SILENCE = frozenset({"unreachable", "unreachable_timeout"})


def host_trusted(state: NodeState, failure_reason: str | None = None) -> bool | None:
    """A host's verdict from its node state (and stored failure reason,
    ``"<reason>: <detail>"``): True attested, False revoked (final) on
    evidence or request, None not known (not attested yet, unreachable,
    failed, or revoked for silence alone)."""
    if state is NodeState.ATTESTED:
        return True
    if state is NodeState.REVOKED:
        reason = (failure_reason or "").partition(":")[0]
        return None if reason in _SILENCE else False
    return None


@dataclasses.dataclass(frozen=True)
class HostVerdict:
    """A host's verdict changed (or is stated again, at start-up).

    Attributes:
        host: the host's provider UUID.
        name: its hypervisor host name.
        old: its verdict before (None: not known).
        new: its verdict now.
    """

    host: str
    name: str
    old: bool | None
    new: bool | None

    @property
    def changed(self) -> bool:
        return self.old is not self.new

    @property
    def trait(self) -> bool:
        """Whether the host's provider carries the trusted trait: only
        while the host is attested."""
        return self.new is True

    @property
    def marks_guests(self) -> bool:
        """Whether each guest of the host becomes ``host_untrusted``: the
        host was found untrusted now (evidence, never silence)."""
        return self.new is False and self.old is not False

    def guest_detail(self) -> str:
        """What a marked guest's event says."""
        return f"its compute host {self.name} is untrusted"


def proven_file_digest(entries: Iterable[ImaEntry], path: str) -> bytes | None:
    """The digest of the last measurement of ``path`` in ``entries`` (an
    attested IMA list, or the part of it judged in one round), or None
    when it was not measured there. Violations prove nothing."""
    found = None
    for entry in entries:
        if entry.path == path and not entry.is_violation:
            found = entry.digest
    return found
