"""What the quote loop asks for and checks beyond the quote itself: the
node's IMA measurement list (incrementally) and its firmware event log
(once per boot). The checks are :mod:`verifier.protocol.evidence`'s; this
module keeps the per-node state between quotes.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from verifier.attest.node import LiveNode
from verifier.protocol import (
    EvidenceError,
    MalformedError,
    Quote,
    bind_nonce,
    verify_quote,
)
from verifier.protocol.evidence import (
    check_ima,
    check_measured_boot,
    extend_ima,
    parse_ima_evidence,
    parse_mb_log,
)
from verifier.protocol.ima import ReplayState

__all__ = ["check_answer", "check_evidence", "quote_params"]

_MAX_ERROR = 300


def quote_params(node: LiveNode, nonce: bytes, first: bool) -> dict[str, str]:
    """The query of a quote request: the PCRs to quote (the PCR policy's,
    plus 10 for IMA and 0-9 for measured boot), the IMA index to send
    entries from, and whether the firmware log is wanted."""
    params = {
        "nonce": nonce.hex(),
        "pcrs": node.quoted_pcrs,
        "csr": "1" if first else "0",
    }
    if node.runtime is not None:
        params["ima_from"] = str(node.ima.count)
    if node.mb is not None:
        boot = node.clock.reset_count if node.clock is not None else None
        if node.mb_boot is None or node.mb_boot != boot:
            params["mb"] = "1"
    return params


def _agent_error(answer: Mapping[str, Any], field: str, reason: str) -> None:
    error = answer.get(field)
    if error is not None:
        shown = str(error)[:_MAX_ERROR]
        raise EvidenceError(reason, f"the node could not send it: {shown}")


def check_evidence(
    node: LiveNode,
    answer: Mapping[str, Any],
    pcr_values: Mapping[int, bytes],
    reset_count: int,
    rebooted: bool,
) -> bool:
    """Check the runtime evidence of a verified quote and advance the node's
    state.

    Args:
        node: the node (its ``ima`` and ``mb_boot`` are updated).
        answer: the node's answer.
        pcr_values: the verified quoted PCR values.
        reset_count: the quote's TPM reset count (identifies the boot).
        rebooted: the TPM was reset since the node's last quote.

    Returns:
        True if the evidence is complete and good; False if another round
        is needed first (the node rebooted and must resend from the start,
        or it sent a long list in parts).

    Raises:
        EvidenceError: naming the failed check (and entry or event).
        MalformedError: evidence that does not parse.
    """
    complete = True
    if rebooted:
        node.ima = ReplayState()
        node.mb_boot = None
    if node.mb is not None and node.mb_boot != reset_count:
        _agent_error(answer, "mb_error", "mb_log_unavailable")
        if "mb_log" not in answer:
            complete = False  # asked before the reboot was known
        else:
            check_measured_boot(parse_mb_log(answer["mb_log"]), pcr_values, node.mb)
            node.mb_boot = reset_count
    if node.runtime is not None:
        _agent_error(answer, "ima_error", "ima_log_unavailable")
        evidence = parse_ima_evidence(answer.get("ima"))
        if rebooted and evidence.first != 0:
            return False
        if evidence.more:
            node.ima = extend_ima(node.ima, evidence, node.runtime)
            return False
        node.ima = check_ima(node.ima, evidence, pcr_values, node.runtime)
    return complete


def check_answer(
    node: LiveNode, answer: Mapping[str, Any], nonce: bytes, first: bool
) -> tuple[bytes, bytes | None, bool]:
    """Verify a node's answer to a quote request made with ``nonce``: the
    quote (bound to the node's transport key NK, and to its CSR on the
    first quote), then its runtime evidence. Advances the node's clock.

    Returns:
        (NK, the CSR or None, whether the evidence is complete).

    Raises:
        EvidenceError: naming the failed check.
        MalformedError: an answer that does not parse.
    """
    quote = Quote.from_dict(answer.get("quote"))
    nk = _b64(answer, "nk")
    if len(nk) != 32:
        raise MalformedError("agent answer", "'nk' is not a 32-byte X25519 key")
    csr = _b64(answer, "csr") if first else None
    bound = (nk, csr) if csr is not None else (nk,)
    verdict = verify_quote(
        quote,
        ak=node.ak,
        qualifying_data=bind_nonce(nonce, *bound),
        policy=node.policy,
        previous_clock=node.clock,
    )
    previous, node.clock = node.clock, verdict.clock
    node.dirty = True
    reset = verdict.clock.reset_count
    rebooted = previous is not None and previous.reset_count != reset
    complete = check_evidence(node, answer, verdict.pcr_values, reset, rebooted)
    return nk, csr, complete


def _b64(answer: Mapping[str, Any], field: str) -> bytes:
    value = answer.get(field)
    if not isinstance(value, str):
        raise MalformedError("agent answer", f"'{field}' missing")
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        raise MalformedError("agent answer", f"'{field}' is not base64")
