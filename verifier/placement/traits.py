"""Keep each host's trust trait in Placement as the verifier decided it.

:class:`TraitSync` holds the desired state per resource provider (the
trait present on an attested host's provider, absent on every other) and
writes what has not landed, retrying until it does. It is synchronous:
:meth:`TraitSync.want` only records (no I/O, cheap, callable from the event
loop) and :meth:`TraitSync.pump` does the HTTP on the caller's thread (the
verifier runs it in a worker thread, e.g. ``asyncio.to_thread``, after each
``want`` and every ``retry_interval``). A steady state costs no request: a
``want`` equal to what landed is a no-op.

The trait is added only by a write started while the provider's latest
``want`` is True. A ``want(provider, False)`` that arrives during that write
is applied by the same :meth:`pump` right after it, before it returns.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid as uuid_mod
from collections.abc import Callable

from verifier.placement.client import (
    PlacementClient,
    PlacementError,
    PlacementReason,
    check_trait,
)

__all__ = ["DEFAULT_TRAIT", "TraitSync"]

#: The trait of an attested host's compute node resource provider.
DEFAULT_TRAIT = "CUSTOM_ATTESTATION_TRUSTED"
LOG = logging.getLogger(__name__)


@dataclasses.dataclass
class _Provider:
    """One provider's desired and landed state."""

    desired: bool
    #: what Placement is known to have; None: unknown (never written, or a
    #: write failed), so the next write reads it first
    landed: bool | None = None
    #: the clock value from which the next write may be tried
    due: float = 0.0
    error: PlacementError | None = None


class TraitSync:
    """Desired trust traits per resource provider, retried until they land.

    Thread-safe: :meth:`want`, :meth:`pending` and :meth:`errors` may be
    called from any thread while :meth:`pump` runs on another; one
    :meth:`pump` runs at a time.

    Args:
        client: the Placement client.
        trait: the custom trait.
        retry_interval: seconds before a failed write is tried again.
        clock: monotonic seconds (:func:`time.monotonic` by default).

    Raises:
        ConfigError: ``trait`` is not a custom trait.
    """

    def __init__(
        self,
        client: PlacementClient,
        trait: str = DEFAULT_TRAIT,
        *,
        retry_interval: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._trait = check_trait(trait)
        self._retry = retry_interval
        self._clock = clock
        self._states: dict[str, _Provider] = {}
        self._lock = threading.Lock()
        self._pumping = threading.Lock()

    @property
    def trait(self) -> str:
        """The custom trait this sync keeps."""
        return self._trait

    def want(self, provider: str, trusted: bool) -> None:
        """Record that ``provider`` should (``trusted``) or should not carry
        the trait; the next :meth:`pump` writes it if it has not landed.

        Raises:
            PlacementError: ``bad_provider``, not a UUID.
        """
        key = _key(provider)
        with self._lock:
            state = self._states.get(key)
            if state is None:
                self._states[key] = _Provider(bool(trusted), due=self._clock())
            elif state.desired != bool(trusted):
                state.desired = bool(trusted)
                state.due = self._clock()  # a change is tried at once

    def resync(self) -> None:
        """Forget what landed: the next :meth:`pump` reads every provider
        again and corrects it (one GET each; e.g. after a restart, or
        periodically against changes made behind the verifier's back)."""
        with self._lock:
            for state in self._states.values():
                state.landed = None
                state.due = min(state.due, self._clock())

    def pending(self) -> dict[str, bool]:
        """Providers whose desired state has not landed, with that state."""
        with self._lock:
            return {
                p: s.desired for p, s in self._states.items() if s.landed != s.desired
            }

    def errors(self) -> dict[str, PlacementError]:
        """The last failure of each pending provider that has one."""
        with self._lock:
            return {
                p: s.error
                for p, s in self._states.items()
                if s.error is not None and s.landed != s.desired
            }

    def next_due(self) -> float | None:
        """The clock value at which :meth:`pump` has work, or None."""
        with self._lock:
            dues = [s.due for s in self._states.values() if s.landed != s.desired]
        return min(dues) if dues else None

    def pump(self) -> dict[str, bool]:
        """Write every pending provider whose time has come (blocking I/O).

        Returns:
            :meth:`pending` afterwards.
        """
        with self._pumping:
            now = self._clock()
            with self._lock:
                due = [
                    p
                    for p, s in self._states.items()
                    if s.landed != s.desired and s.due <= now
                ]
            for provider in due:
                self._sync(provider)
        return self.pending()

    def _sync(self, provider: str) -> None:
        """Write ``provider`` until what landed is its latest want, or a
        write fails (then retried after ``retry_interval``)."""
        while True:
            with self._lock:
                state = self._states[provider]
                wanted = state.desired
                if state.landed == wanted:
                    return
            try:
                self._client.set_trait(provider, self._trait, wanted)
            except PlacementError as exc:
                self._failed(provider, state, exc)
                return
            with self._lock:
                state.landed, state.error = wanted, None
            LOG.info(
                "Placement: trait %s %s resource provider %s",
                self._trait,
                "on" if wanted else "off",
                provider,
            )

    def _failed(self, provider: str, state: _Provider, exc: PlacementError) -> None:
        with self._lock:
            repeated = state.error is not None and state.error.reason == exc.reason
            state.landed, state.error = None, exc
            state.due = self._clock() + self._retry
        LOG.log(
            logging.DEBUG if repeated else logging.WARNING,
            "Placement: could not %s trait %s on resource provider %s (retried "
            "every %.0f s): %s",
            "put" if state.desired else "remove",
            self._trait,
            provider,
            self._retry,
            exc,
        )


def _key(provider: str) -> str:
    try:
        return str(uuid_mod.UUID(provider))
    except (ValueError, AttributeError, TypeError):
        raise PlacementError(
            PlacementReason.BAD_PROVIDER,
            str(provider)[:40],
            f"resource provider {str(provider)[:40]!r} is not a UUID",
        ) from None
