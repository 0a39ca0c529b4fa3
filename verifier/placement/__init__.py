"""Placement traits of attested hosts (trusted compute pools, issue 29).

* :mod:`~verifier.placement.client` -- :class:`PlacementClient`, a resource
  provider's traits read-modify-write with its generation, through one
  keystoneauth adapter; every failure is a :class:`PlacementError`;
* :mod:`~verifier.placement.traits` -- :class:`TraitSync`, the desired
  trait per provider, written until it lands.
"""

from verifier.placement.client import (
    MICROVERSION,
    NOAUTH_HEADERS,
    PlacementClient,
    PlacementError,
    PlacementReason,
    check_trait,
    noauth_adapter,
)
from verifier.placement.traits import DEFAULT_TRAIT, TraitSync

__all__ = [
    "DEFAULT_TRAIT",
    "MICROVERSION",
    "NOAUTH_HEADERS",
    "PlacementClient",
    "PlacementError",
    "PlacementReason",
    "TraitSync",
    "check_trait",
    "noauth_adapter",
]
