"""Property tests of every typed wire message: ``from_dict`` of any JSON
value either gives a message that writes itself back to an equal one, or
raises :class:`MalformedError` -- never anything else."""

from __future__ import annotations

import base64
import json
import os
import uuid as uuid_mod
from typing import Any

import testtools
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verifier.protocol import PcrPolicy
from verifier.protocol.abe import setup
from verifier.protocol.errors import MalformedError
from verifier.protocol.ima import Failure
from verifier.protocol.messages.abe import AbeKeyDelivery, AbeParams, SealedBlobRequest
from verifier.protocol.messages.capabilities import CapabilityGrant, CapabilityRequest
from verifier.protocol.messages.enrolment import EnrolmentRequest, RevokeRequest
from verifier.protocol.messages.errors import ErrorBody
from verifier.protocol.messages.keyservice import (
    FilegroupState,
    RekeyLog,
    SecretRelease,
    SecretUpload,
)
from verifier.protocol.messages.monitor import MonitorChallenge, MonitorIdentity
from verifier.protocol.messages.policies import PolicyUpload
from verifier.protocol.messages.policy_check import (
    NodeCheck,
    PolicyCheckReport,
    PolicyCheckRequest,
    PolicyRef,
)
from verifier.protocol.messages.provider import (
    ProviderEkRecord,
    ProviderEkRegistration,
    ProviderEkResult,
)
from verifier.protocol.messages.registration import (
    ActivationChallenge,
    ActivationProof,
    ActivationResult,
    RegistrationRecord,
    RegistrationRequest,
)
from verifier.protocol.messages.shares import ShareAccepted, ShareU, ShareV
from verifier.tests.unit.test_messages_registration import CERT, TPM, UUID

#: One valid instance of every message.
EXAMPLES: list[Any] = [
    RegistrationRequest(TPM.ek, b"der", TPM.ak, CERT, "192.0.2.7", 8892),
    RegistrationRecord(UUID, TPM.ek, None, TPM.ak, CERT, "node.example", 1, True),
    ActivationChallenge(b"blob", b"secret"),
    ActivationProof(bytes(32)),
    ActivationResult(UUID, True),
    ProviderEkRegistration(TPM.ek, b"der"),
    ProviderEkRecord(UUID, TPM.ek, None, "compute-1"),
    ProviderEkResult(UUID, True),
    MonitorChallenge(bytes(32)),
    MonitorIdentity(TPM.ak, TPM.ek, b"der", (0, 16)),
    EnrolmentRequest(
        UUID, bytes(32), PcrPolicy({16: frozenset({bytes(32)})}), u_commitment=bytes(32)
    ),
    RevokeRequest("why"),
    CapabilityRequest("secret:x", "r"),
    CapabilityGrant("body.mac", 10, 1),
    ShareU(os.urandom(96), os.urandom(64), UUID),
    ShareV(os.urandom(96), CERT),
    ShareAccepted("v", False),
    AbeParams(setup()[0], 2),
    AbeKeyDelivery(b"key", b"params", 2),
    SealedBlobRequest(b"blob"),
    SecretUpload(b"s"),
    SecretRelease(b"s"),
    RekeyLog(1, (b"m",)),
    FilegroupState("fg", 0, bytes(32), bytes(32)),
    PolicyUpload({"name": "x"}, "x", b"sig"),
    PolicyCheckRequest((UUID,)),
    PolicyCheckRequest(all=True),
    PolicyCheckReport(
        PolicyRef("web", 5, "ab" * 32),
        (
            NodeCheck.judged(UUID, 9, [Failure(7, "/x", "unknown_file", "d")]),
            NodeCheck.judged(UUID, 9, []),
            NodeCheck.error_of(UUID, "timeout", "no answer"),
        ),
    ),
    ErrorBody("bad_field", "'v' is not base64"),
]

_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_B64 = st.binary(max_size=80).map(lambda b: base64.b64encode(b).decode())
_UUIDS = st.uuids().map(str)


def _near(example: Any) -> st.SearchStrategy[dict[str, Any]]:
    """Dicts with the example's fields, each kept, dropped or replaced by
    arbitrary JSON, base64 of random bytes, a UUID or a neighbour integer."""
    fields = example.to_dict()

    def value(name: str) -> st.SearchStrategy[Any]:
        good = fields[name]
        options = [st.just(good), _JSON, _B64, _UUIDS]
        if isinstance(good, int) and not isinstance(good, bool):
            options.append(st.integers(min_value=good - 2, max_value=good + 2))
        return st.one_of(*options)

    strategies = {name: value(name) for name in fields}
    extra = st.dictionaries(st.text(max_size=6), _JSON, max_size=1)
    return st.builds(
        lambda picked, dropped, more: (
            {k: v for k, v in picked.items() if k not in dropped} | more
        ),
        st.fixed_dictionaries(strategies),
        st.sets(st.sampled_from(sorted(fields)), max_size=2),
        extra,
    )


def _check(cls: Any, data: object) -> None:
    try:
        msg = cls.from_dict(data)
    except MalformedError:
        return
    wire = json.loads(json.dumps(msg.to_dict()))
    assert cls.from_dict(wire) == msg, (data, wire)


_SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


class MessagesPropertyTest(testtools.TestCase):
    def test_every_example_round_trips_through_json(self) -> None:
        for example in EXAMPLES:
            wire = json.loads(json.dumps(example.to_dict()))
            self.assertEqual(example, type(example).from_dict(wire))

    @_SETTINGS
    @given(data=_JSON, index=st.integers(0, len(EXAMPLES) - 1))
    def test_arbitrary_json_raises_only_malformed(self, data: Any, index: int) -> None:
        _check(type(EXAMPLES[index]), data)

    @settings(_SETTINGS, max_examples=300)
    @given(data=st.data(), index=st.integers(0, len(EXAMPLES) - 1))
    def test_mutated_messages_raise_only_malformed(
        self, data: st.DataObject, index: int
    ) -> None:
        example = EXAMPLES[index]
        _check(type(example), data.draw(_near(example)))


def _uuid_pairs() -> list[tuple[str, str]]:
    u = uuid_mod.uuid4()
    return [(str(u).upper(), str(u)), ("{" + str(u) + "}", str(u))]


class CanonicalUuidTest(testtools.TestCase):
    def test_uuid_fields_are_canonical_after_parsing(self) -> None:
        for given_form, canonical in _uuid_pairs():
            msg = ActivationResult.from_dict({"uuid": given_form, "activated": True})
            self.assertEqual(canonical, msg.uuid)
