"""Consume signed revocation events and run the configured actions.

For each delivery the :class:`Consumer`:

1. parses the wire form (a malformed event is rejected); a ``node.failed``
   event (the verifier no longer vouches for the node) runs the
   ``failed_actions``, by default the same actions as a revocation; a
   ``node.unreachable`` or ``node.recovered`` event its own actions, by
   default only the ``log``: a node that stopped answering is not revoked;
   a ``node.host_untrusted`` event (the node's compute host was found
   untrusted) runs the ``host_untrusted_actions``, by default the
   revocation's; a ``node.policy_changed`` event (a new policy in force)
   runs none;
2. picks the verifier key named by ``key_id`` and verifies the signature
   (an event signed by an unknown key or not verifying is rejected);
3. skips events whose id it has already processed (acked as duplicate);
4. runs every action, retrying a failing one with exponential back-off and
   dead-lettering it after ``max_attempts`` tries, without blocking the
   other actions;
5. remembers the event id and acknowledges the event.

A rejected event raises :class:`EventRejectedError`: it is never
acknowledged and runs no action.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import stevedore
from cryptography.hazmat.primitives.asymmetric import ed25519
from oslo_config import cfg
from oslo_log import log as logging

from ipsec_puppet_vault_hooks.actions.base import Action
from ipsec_puppet_vault_hooks.conf import revocation_hooks as hooks_conf
from ipsec_puppet_vault_hooks.exceptions import (
    EventRejectedError,
    HooksError,
)
from ipsec_puppet_vault_hooks.keys import load_public_key
from ipsec_puppet_vault_hooks.stores import DeadLetter, DeadLetterStore, DedupStore
from verifier.common import extras, metrics
from verifier.protocol import (
    EvidenceError,
    MalformedError,
    RevocationEvent,
    SignedEvent,
)
from verifier.protocol.events import (
    NODE_FAILED,
    NODE_HOST_UNTRUSTED,
    NODE_POLICY_CHANGED,
    NODE_RECOVERED,
    NODE_UNREACHABLE,
    key_id,
)

__all__ = [
    "ACTIONS_NAMESPACE",
    "ConsumeResult",
    "Consumer",
    "DeadLetter",
    "DeadLetterStore",
    "DedupStore",
    "load_actions",
]

LOG = logging.getLogger(__name__)

ACTIONS_NAMESPACE = "ipsec_puppet_vault_hooks.actions"
DEDUP_FILE = "processed_events.jsonl"
DEAD_LETTER_FILE = "dead_letters.jsonl"


def load_actions(conf: cfg.ConfigOpts, names: Sequence[str]) -> list[Action]:
    """Build actions by entry-point name, in the order given.

    Args:
        conf: passed to each action's constructor.
        names: entry-point names in the ``ipsec_puppet_vault_hooks.actions``
            group.

    Returns:
        One built action per name.

    Raises:
        HooksError: naming an unknown action, one that fails to load (or
            the extra it needs, e.g. ``vault``), or one that is not an
            :class:`Action`.
    """
    names = list(names)
    if not names:
        return []
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise HooksError(f"action(s) listed more than once: {', '.join(twice)}")

    def _missing(missing: Iterable[str]) -> None:
        raise HooksError(f"unknown action(s): {', '.join(sorted(missing))}")

    def _failed(_mgr: object, entrypoint: Any, exc: BaseException) -> None:
        raise HooksError(
            f"cannot load action {entrypoint.name!r}: {extras.explain(exc)}"
        ) from exc

    try:
        manager: stevedore.NamedExtensionManager[Action] = (
            stevedore.NamedExtensionManager(
                ACTIONS_NAMESPACE,
                names,
                invoke_on_load=True,
                invoke_args=(conf,),
                name_order=True,
                on_load_failure_callback=_failed,
                on_missing_entrypoints_callback=_missing,
            )
        )
    except HooksError:
        raise
    except Exception as exc:
        raise HooksError(f"cannot load actions {names}: {exc}") from exc
    actions: list[Action] = []
    for ext in manager.extensions:
        if not isinstance(ext.obj, Action):
            raise HooksError(f"action {ext.name!r} is not an Action")
        actions.append(ext.obj)
    return actions


@dataclasses.dataclass(frozen=True)
class ConsumeResult:
    """What happened to one delivered event.

    Attributes:
        event_id: the event's id.
        acked: whether the event is acknowledged (always true when
            :meth:`Consumer.consume` returns).
        duplicate: the event had already been processed; no action ran.
        dead_lettered: names of the actions that gave up on the event.
    """

    event_id: str
    acked: bool
    duplicate: bool = False
    dead_lettered: tuple[str, ...] = ()


def stores(state_dir: str | None) -> tuple[DedupStore, DeadLetterStore]:
    """The processed ids and dead letters: kept in ``state_dir`` (created if
    needed) so that they survive a restart, or in memory without it.

    Raises:
        HooksError: if ``state_dir`` cannot be created or its files read.
    """
    if not state_dir:
        return DedupStore(), DeadLetterStore()
    try:
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise HooksError(f"cannot create state_dir {state_dir}: {exc}") from exc
    return (
        DedupStore(os.path.join(state_dir, DEDUP_FILE)),
        DeadLetterStore(os.path.join(state_dir, DEAD_LETTER_FILE)),
    )


class Consumer:
    """Verifies revocation events and runs actions on them.

    Args:
        public_keys: the verifier's Ed25519 public keys; an event must be
            signed by one of them.
        actions: built :class:`Action` instances, or entry-point names
            loaded with :func:`load_actions` (then ``conf`` is required).
        max_attempts: tries per action per event before dead-lettering.
        retry_delay: seconds before the first retry, doubled each retry.
        dedup: processed-event store (default: in memory).
        dead_letters: dead-letter store (default: in memory).
        sleep: called with the back-off delay (tests pass a fake).
        conf: configuration passed to actions loaded by name.
        failed_actions: the actions run for ``node.failed`` events
            (default: ``actions``: a failed node is cut off like a revoked
            one).
        unreachable_actions: the actions run for ``node.unreachable``
            events (default: none).
        recovered_actions: the actions run for ``node.recovered`` events
            (default: none).
        host_untrusted_actions: the actions run for ``node.host_untrusted``
            events (default: ``actions``: a guest whose host was found
            untrusted is treated as compromised).

    Raises:
        HooksError: if there is no public key, ``max_attempts`` < 1,
            ``retry_delay`` < 0, or an action name cannot be loaded.
    """

    def __init__(
        self,
        public_keys: Sequence[ed25519.Ed25519PublicKey],
        actions: Sequence[Action | str],
        *,
        max_attempts: int = 3,
        retry_delay: float = 0.0,
        dedup: DedupStore | None = None,
        dead_letters: DeadLetterStore | None = None,
        sleep: Callable[[float], None] = time.sleep,
        conf: cfg.ConfigOpts | None = None,
        failed_actions: Sequence[Action | str] | None = None,
        unreachable_actions: Sequence[Action | str] = (),
        recovered_actions: Sequence[Action | str] = (),
        host_untrusted_actions: Sequence[Action | str] | None = None,
    ) -> None:
        if not public_keys:
            raise HooksError("at least one verifier public key is required")
        if max_attempts < 1:
            raise HooksError(f"max_attempts must be >= 1, not {max_attempts}")
        if retry_delay < 0:
            raise HooksError(f"retry_delay must be >= 0, not {retry_delay}")
        self._keys = {key_id(k): k for k in public_keys}
        self.actions = self._build_actions(actions, conf)
        self.failed_actions = (
            self.actions
            if failed_actions is None
            else self._build_actions(failed_actions, conf)
        )
        #: what runs for each event type (a revocation: ``actions``)
        self.by_type: dict[str, list[Action]] = {
            NODE_FAILED: self.failed_actions,
            NODE_UNREACHABLE: self._build_actions(unreachable_actions, conf),
            NODE_RECOVERED: self._build_actions(recovered_actions, conf),
            NODE_HOST_UNTRUSTED: (
                self.actions
                if host_untrusted_actions is None
                else self._build_actions(host_untrusted_actions, conf)
            ),
            # a new policy in force takes nothing away: no action runs
            NODE_POLICY_CHANGED: [],
        }
        self.max_attempts = max_attempts
        self.retry_delay = retry_delay
        self.dedup = dedup if dedup is not None else DedupStore()
        self.dead_letters = (
            dead_letters if dead_letters is not None else DeadLetterStore()
        )
        self._sleep = sleep

    @staticmethod
    def _build_actions(
        actions: Sequence[Action | str], conf: cfg.ConfigOpts | None
    ) -> list[Action]:
        names = [a for a in actions if isinstance(a, str)]
        loaded: Iterator[Action] = iter(())
        if names:
            if conf is None:
                raise HooksError(f"conf is required to load actions {names}")
            loaded = iter(load_actions(conf, names))
        built: list[Action] = []
        for item in actions:
            action = next(loaded) if isinstance(item, str) else item
            if not isinstance(action, Action):
                raise HooksError(f"{item!r} is not an Action or an action name")
            built.append(action)
        return built

    @classmethod
    def from_conf(
        cls,
        conf: cfg.ConfigOpts,
        *,
        sleep: Callable[[float], None] = time.sleep,
        public_key: ed25519.Ed25519PublicKey | None = None,
    ) -> Consumer:
        """Build a consumer from the ``[revocation_hooks]`` options.

        Registers this package's options on ``conf`` if needed. With
        ``state_dir`` set, processed ids and dead letters are kept in
        ``processed_events.jsonl`` and ``dead_letters.jsonl`` there.
        ``public_key`` is the verifier's (None: ``verifier_public_key``).

        Raises:
            HooksError: if ``verifier_public_key`` is unset or bad, an
                action cannot be loaded, or ``state_dir`` is unusable.
        """
        hooks_conf.register_opts(conf)
        group = conf.revocation_hooks
        if public_key is None:
            if not group.verifier_public_key:
                raise HooksError("[revocation_hooks] verifier_public_key is not set")
            public_key = load_public_key(group.verifier_public_key)
        dedup, dead_letters = stores(group.state_dir)
        return cls(
            [public_key],
            list(group.actions),
            max_attempts=group.max_attempts,
            retry_delay=group.retry_delay,
            dedup=dedup,
            dead_letters=dead_letters,
            sleep=sleep,
            conf=conf,
            failed_actions=(
                None if group.failed_actions is None else list(group.failed_actions)
            ),
            unreachable_actions=list(group.unreachable_actions or ()),
            recovered_actions=list(group.recovered_actions or ()),
            host_untrusted_actions=(
                None
                if group.host_untrusted_actions is None
                else list(group.host_untrusted_actions)
            ),
        )

    def consume(self, data: Mapping[str, Any] | SignedEvent) -> ConsumeResult:
        """Verify one delivered event and run the actions on it.

        Args:
            data: the wire dict or an already-parsed :class:`SignedEvent`.

        Returns:
            The outcome; the event may be acknowledged.

        Raises:
            EventRejectedError: the event is malformed or its signature
                does not verify; do not acknowledge it.
            HooksError: the consumer's state could not be saved; the event
                is not acknowledged and may be redelivered (actions are
                idempotent).
        """
        try:
            signed = (
                data if isinstance(data, SignedEvent) else SignedEvent.from_dict(data)
            )
        except MalformedError as exc:
            raise EventRejectedError("malformed", str(exc)) from exc
        key = self._keys.get(signed.key_id)
        if key is None:
            raise EventRejectedError(
                "event_signature", f"event signed by unknown key {signed.key_id!r}"
            )
        try:
            event = signed.verify(key)
        except EvidenceError as exc:
            raise EventRejectedError(exc.reason, exc.detail) from exc

        if event.id in self.dedup:
            LOG.debug("Event %s already processed, skipping", event.id)
            return ConsumeResult(event.id, acked=True, duplicate=True)

        dead: list[str] = []
        event_dict = dataclasses.asdict(event)
        actions = self.by_type.get(event.type, self.actions)
        for action in actions:
            error = self._run(action, event)
            metrics.hook_action(action.name, error is None)
            if error is not None:
                metrics.dead_letter(action.name)
                self.dead_letters.add(
                    DeadLetter(event_dict, action.name, error, self.max_attempts)
                )
                LOG.error(
                    "Action %s gave up on event %s after %d attempts: %s",
                    action.name,
                    event.id,
                    self.max_attempts,
                    error,
                )
                dead.append(action.name)
        self.dedup.add(event.id)
        return ConsumeResult(event.id, acked=True, dead_lettered=tuple(dead))

    def _run(self, action: Action, event: RevocationEvent) -> str | None:
        """Try ``action`` up to max_attempts times; return the last error."""
        error = ""
        for attempt in range(self.max_attempts):
            try:
                action.handle(event)
                return None
            except Exception as exc:  # any action failure must not block others
                error = str(exc)
                LOG.warning(
                    "Action %s failed on event %s (attempt %d/%d): %s",
                    action.name,
                    event.id,
                    attempt + 1,
                    self.max_attempts,
                    error,
                )
            if attempt + 1 < self.max_attempts:
                self._sleep(self.retry_delay * 2**attempt)
        return error
