"""The verifier service's settings: read once from ``[verifier]`` and
``[push]`` and handed to the parts that use them, typed (no option is
looked up by name anywhere else in :mod:`verifier.attest`).
"""

from __future__ import annotations

import dataclasses
import enum

from oslo_config import cfg

from verifier.attest.node import LiveNode, NodeView
from verifier.protocol.attestation import AttestationMode, AttestationRules
from verifier.protocol.push import PushRules

__all__ = ["UnreachableAction", "VerifierSettings"]


class UnreachableAction(enum.StrEnum):
    """What becomes of a node that missed ``max_unreachable`` rounds."""

    #: marked unreachable (its event sent), still polled: a good quote
    #: brings it back
    FAIL = "fail"
    #: revoked (final)
    REVOKE = "revoke"


@dataclasses.dataclass(frozen=True)
class VerifierSettings:
    """How one verifier process attests.

    Attributes:
        interval: seconds between quotes of one node (unless the node has
            its own verification class).
        min_node_interval: the shortest quote interval a tenant may give
            a node.
        max_unreachable: unanswered rounds before the unreachable action.
        unreachable_action: what happens then.
        unreachable_timeout: seconds of silence after which a node is
            revoked (None: never).
        max_in_flight: at most this many quote rounds run at once, so a
            large fleet or slow agents cannot exhaust sockets or memory.
        outbox_interval: seconds between outbox passes.
        sync_interval: seconds between ownership/database syncs when
            several verifiers share the database.
        push_rules: limits on evidence pushed by ``push`` nodes
            (:mod:`verifier.attest.push`).
        trust_window: the oldest a node's last good quote may be for the
            API to call it ``trusted`` (None: three of its intervals, at
            least 10 s).
        log_interval: seconds between the attestation log's sequencing
            passes (a committed change wakes it at once).
        log_retention_days: the log's entries older than this lose their
            bodies (0: kept for ever).
        event_retention_days: delivered events older than this are
            deleted from the outbox (0: kept for ever).

    Raises:
        ValueError: an unknown ``unreachable_action``.
    """

    interval: float
    min_node_interval: float = 1.0
    max_unreachable: int = 5
    unreachable_action: UnreachableAction = UnreachableAction.FAIL
    unreachable_timeout: float | None = 900.0
    max_in_flight: int = 512
    outbox_interval: float = 0.5
    sync_interval: float = 1.0
    push_rules: PushRules = dataclasses.field(default_factory=PushRules)
    trust_window: float | None = None
    log_interval: float = 1.0
    log_retention_days: float = 0.0
    event_retention_days: float = 0.0

    def __post_init__(self) -> None:
        try:
            action = UnreachableAction(self.unreachable_action)
        except ValueError:
            raise ValueError("unreachable_action must be 'fail' or 'revoke'")
        object.__setattr__(self, "unreachable_action", action)

    @property
    def rules(self) -> AttestationRules:
        """The operator's rules the pure core judges with."""
        return AttestationRules(
            max_unreachable=self.max_unreachable,
            revoke_unreachable=self.unreachable_action is UnreachableAction.REVOKE,
            unreachable_timeout=self.unreachable_timeout,
        )

    def interval_of(self, node: LiveNode) -> float:
        """Seconds between rounds of ``node``: its own quote interval (its
        verification class) or ours; a push node's visit only checks its
        deadline, at most once a second."""
        interval = self.interval if node.interval is None else node.interval
        if node.mode is not AttestationMode.PULL:
            return max(interval, 1)
        return interval

    def trust_window_of(self, view: NodeView) -> float:
        """How old the last good quote of the node ``view`` may be while
        it is called trusted."""
        if self.trust_window is not None:
            return self.trust_window
        interval = self.interval if view.interval is None else view.interval
        if view.mode is AttestationMode.PUSH:
            interval += self.push_rules.challenge_ttl
        return max(10.0, 3 * interval)

    @classmethod
    def from_conf(cls, conf: cfg.ConfigOpts) -> VerifierSettings:
        """The settings of ``[verifier]`` and ``[push]``."""
        group, push = conf.verifier, conf.push
        return cls(
            interval=group.quote_interval,
            min_node_interval=group.min_node_interval,
            max_unreachable=group.max_unreachable,
            unreachable_action=group.unreachable_action,
            unreachable_timeout=group.unreachable_timeout or None,
            max_in_flight=group.max_in_flight,
            outbox_interval=group.outbox_interval,
            sync_interval=group.sync_interval,
            trust_window=group.trust_window or None,
            log_interval=group.log_interval,
            log_retention_days=group.log_retention_days,
            event_retention_days=group.event_retention_days,
            push_rules=PushRules(
                challenge_ttl=push.challenge_ttl,
                min_gap=push.min_interval,
                session_ttl=push.session_ttl,
                max_evidence_bytes=push.max_evidence_bytes,
            ),
        )
