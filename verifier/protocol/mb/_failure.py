"""One measured-boot policy violation (shared by :mod:`.policy` and
:mod:`.chain`)."""

from __future__ import annotations

import dataclasses

__all__ = ["Failure"]


@dataclasses.dataclass(frozen=True, slots=True)
class Failure:
    """One policy violation.

    Attributes:
        index: index of the offending event, or ``None`` if the failure is
            about a missing event.
        event_type: the ``EV_*`` name of the event (or of the missing one).
        reason: what is wrong and what the policy expected.
        pcr: the event's PCR, where known.
    """

    index: int | None
    event_type: str
    reason: str
    pcr: int | None = None

    def __str__(self) -> str:
        where = "log" if self.index is None else f"event {self.index}"
        kind = (
            self.event_type
            if self.pcr is None
            else f"{self.event_type}, PCR {self.pcr}"
        )
        return f"{where} ({kind}): {self.reason}"
