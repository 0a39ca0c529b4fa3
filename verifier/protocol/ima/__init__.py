"""Linux IMA: the runtime measurement list, its replay into PCR 10, and
runtime policies (allowlists, excludes, signing keys, ima-buf allowances).

Pure and I/O-free like the rest of :mod:`verifier.protocol`.
"""

from verifier.protocol.ima.generate import policy_from_files, policy_from_log
from verifier.protocol.ima.judge import check, evaluate
from verifier.protocol.ima.keys import ImaKey, verify_ima_signature
from verifier.protocol.ima.log import ImaEntry, parse_ascii, parse_binary
from verifier.protocol.ima.policy import Failure, RuntimePolicy
from verifier.protocol.ima.replay import (
    ReplayState,
    boot_aggregate,
    check_against_pcr,
    check_boot_aggregate,
    replay,
    replay_to_pcr,
)
from verifier.protocol.ima.signing import sign, verify

__all__ = [
    "Failure",
    "ImaEntry",
    "ImaKey",
    "ReplayState",
    "RuntimePolicy",
    "boot_aggregate",
    "check",
    "check_against_pcr",
    "check_boot_aggregate",
    "evaluate",
    "parse_ascii",
    "parse_binary",
    "policy_from_files",
    "policy_from_log",
    "replay",
    "replay_to_pcr",
    "sign",
    "verify",
    "verify_ima_signature",
]
