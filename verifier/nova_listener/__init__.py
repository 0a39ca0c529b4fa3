"""The Nova notification listener (provider side): enrolment follows the
instance through its life. See :mod:`verifier.nova_listener.listener`."""

from verifier.nova_listener.hooks import (
    InstanceHook,
    InstanceHookError,
    InstanceHookRetryError,
    NoopHook,
)
from verifier.nova_listener.listener import (
    InstanceEndpoint,
    ListenerError,
    VerifierOperator,
    make_listener,
)

__all__ = [
    "InstanceEndpoint",
    "InstanceHook",
    "InstanceHookError",
    "InstanceHookRetryError",
    "ListenerError",
    "NoopHook",
    "VerifierOperator",
    "make_listener",
]
