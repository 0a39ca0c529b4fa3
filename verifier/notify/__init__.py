"""Delivery of signed revocation events from the verifier's outbox.

Events are written to the outbox in the same transaction that revokes the
node; :class:`Outbox` hands each undelivered event to every configured
notifier driver (stevedore group ``verifier.notifiers``) and marks it
delivered only when all of them acknowledged it.
"""

from verifier.notify.base import Notifier, NotifierError, load_notifiers
from verifier.notify.outbox import Outbox

__all__ = ["Notifier", "NotifierError", "Outbox", "load_notifiers"]
