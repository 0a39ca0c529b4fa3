"""What every page does with the API's failures (the contract of the
dashboard): unreachable -> one line on the page and empty tables (Horizon
keeps working); 404 -> Horizon's not-found page; 401/403 -> Horizon's
not-authorized page; another refusal -> one line with the API's message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from django import http
from horizon import exceptions, messages

from attestation_dashboard.exceptions import (
    AttestationForbiddenError,
    AttestationNotFoundError,
    AttestationRefusedError,
    AttestationUnreachableError,
)

__all__ = ["UNREACHABLE", "fetch", "refused", "unreachable"]

#: The one line a page shows when the API cannot be reached.
UNREACHABLE = "The attestation service cannot be reached: {reason}."
_SAID = "_attestation_said"
T = TypeVar("T")


def _once(request: Any, key: str) -> bool:
    said = getattr(request, _SAID, None)
    if said is None:
        said = set()
        setattr(request, _SAID, said)
    if key in said:
        return False
    said.add(key)
    return True


def unreachable(request: Any, exc: AttestationUnreachableError) -> None:
    """Say once per page that the API cannot be reached."""
    if _once(request, "unreachable"):
        messages.error(request, UNREACHABLE.format(reason=exc.reason))


def refused(request: Any, exc: AttestationRefusedError) -> None:
    """Map a refusal: 404 and 403 to Horizon's pages, others to one line."""
    if isinstance(exc, AttestationNotFoundError):
        raise http.Http404(exc.message)
    if isinstance(exc, AttestationForbiddenError):
        raise exceptions.NotAuthorized(exc.message)
    if _once(request, f"refused:{exc.code}:{exc.message}"):
        messages.error(request, f"The attestation service refused: {exc.message}.")


def fetch(
    request: Any,
    call: Callable[..., T],
    *args: Any,
    default: Any,
    empty_if_missing: bool = False,
) -> T:
    """``call(request, *args)``, or ``default`` after the page was told
    why not (see the module docstring); with ``empty_if_missing``, a 404
    is ``default`` too (e.g. a node with no history yet)."""
    try:
        return call(request, *args)
    except AttestationUnreachableError as exc:
        unreachable(request, exc)
    except AttestationNotFoundError as exc:
        if not empty_if_missing:
            raise http.Http404(exc.message)
    except AttestationRefusedError as exc:
        refused(request, exc)
    out: T = default
    return out
