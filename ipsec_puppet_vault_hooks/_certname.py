"""Node UUID <-> Puppet certname.

A node's Puppet certname is made from its Nova instance UUID by a template
with exactly one ``{uuid}`` field (default: the UUID itself, so the agent
runs with ``--certname <uuid>``). The same template maps a certname back to
the UUID, which is what the autosign executable asks the verifier about.
"""

from __future__ import annotations

import re
import uuid as uuid_mod

__all__ = ["CertnameTemplate"]

_FIELD = "{uuid}"
_UUID_RE = (
    "([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})"
)


class CertnameTemplate:
    """Maps node UUIDs to certnames and back.

    Args:
        template: e.g. ``{uuid}`` or ``{uuid}.nodes.example.org``.

    Raises:
        ValueError: the template does not contain ``{uuid}`` exactly once,
            or contains other braces.
    """

    def __init__(self, template: str) -> None:
        if template.count(_FIELD) != 1:
            raise ValueError(
                f"certname template {template!r} must contain {_FIELD} exactly once"
            )
        prefix, suffix = template.split(_FIELD)
        if any(c in prefix + suffix for c in "{}"):
            raise ValueError(
                f"certname template {template!r}: only the {_FIELD} field is allowed"
            )
        self.template = template
        self._prefix = prefix
        self._suffix = suffix
        self._re = re.compile(re.escape(prefix) + _UUID_RE + re.escape(suffix))

    def certname(self, uuid: str) -> str:
        """The certname of node ``uuid`` (Puppet certnames are lower case)."""
        return f"{self._prefix}{uuid}{self._suffix}".lower()

    def uuid(self, certname: str) -> str | None:
        """The node UUID a certname belongs to, or None if it does not match
        the template."""
        match = self._re.fullmatch(certname)
        if match is None:
            return None
        return str(uuid_mod.UUID(match.group(1)))
