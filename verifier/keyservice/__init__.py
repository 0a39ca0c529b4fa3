"""The key service: capability-checked secrets, LKH group keys and
key-regression filegroups, revoked by one signed event."""

from verifier.keyservice.app import make_app
from verifier.keyservice.service import KeyService

__all__ = ["KeyService", "make_app"]
