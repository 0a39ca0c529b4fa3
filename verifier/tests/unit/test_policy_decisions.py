"""oslo.policy's decisions, remembered a few seconds by the API
(:class:`verifier.api.authz.PolicyDecisions`): the same question gets
oslo.policy's own answer, another caller or target is asked anew, and an
answer is forgotten after its time or when the store is full."""

from __future__ import annotations

from typing import Any

import testtools
from oslo_config import cfg
from oslo_context import context

from verifier.api.authz import PolicyDecisions
from verifier.policies import ALL_PROJECTS, make_enforcer

RULE = "attestation:node:revoke"


def _ctx(project: str | None, *roles: str) -> context.RequestContext:
    return context.RequestContext(project_id=project, roles=list(roles))


class CountingEnforcer:
    """The real enforcer, counting the questions it is asked."""

    def __init__(self) -> None:
        conf = cfg.ConfigOpts()
        conf([], project="trusted-cloud")
        self.real = make_enforcer(conf)
        self.asked = 0

    def authorize(self, *args: Any, **kwargs: Any) -> Any:
        self.asked += 1
        return self.real.authorize(*args, **kwargs)


class PolicyDecisionsTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.now = 100.0
        self.enforcer = CountingEnforcer()
        self.decisions = PolicyDecisions(
            self.enforcer,  # type: ignore[arg-type]
            ttl=5.0,
            size=3,
            clock=lambda: self.now,
        )

    def allowed(self, rule: str, ctx: context.RequestContext) -> bool:
        return self.decisions.allowed(rule, {"project_id": ctx.project_id}, ctx)

    def test_the_answers_are_oslo_policys(self) -> None:
        member, reader = _ctx("p1", "member", "reader"), _ctx("p1", "reader")
        self.assertTrue(self.allowed(RULE, member))
        self.assertFalse(self.allowed(RULE, reader))
        self.assertFalse(self.allowed(ALL_PROJECTS, member))
        self.assertTrue(self.allowed(ALL_PROJECTS, _ctx("p0", "admin")))
        self.assertEqual(4, self.enforcer.asked)

    def test_the_same_question_is_answered_from_memory(self) -> None:
        for _ in range(3):
            self.assertTrue(self.allowed(RULE, _ctx("p1", "member")))
        self.assertEqual(1, self.enforcer.asked)

    def test_a_reader_never_gets_a_members_answer(self) -> None:
        self.assertTrue(self.allowed(RULE, _ctx("p1", "member")))
        self.assertFalse(self.allowed(RULE, _ctx("p1", "reader")))
        self.assertEqual(2, self.enforcer.asked)

    def test_another_target_is_asked_anew(self) -> None:
        member = _ctx("p1", "member")
        self.assertTrue(self.decisions.allowed(RULE, {"project_id": "p1"}, member))
        self.assertFalse(self.decisions.allowed(RULE, {"project_id": "p2"}, member))
        self.assertEqual(2, self.enforcer.asked)

    def test_an_answer_is_forgotten_after_its_time(self) -> None:
        member = _ctx("p1", "member")
        self.allowed(RULE, member)
        self.now += 4.9
        self.allowed(RULE, member)
        self.assertEqual(1, self.enforcer.asked)
        self.now += 0.2
        self.allowed(RULE, member)
        self.assertEqual(2, self.enforcer.asked)

    def test_a_full_store_starts_again(self) -> None:
        for project in ("p1", "p2", "p3", "p4"):
            self.allowed(RULE, _ctx(project, "member"))
        self.allowed(RULE, _ctx("p1", "member"))  # dropped when p4 came
        self.assertEqual(5, self.enforcer.asked)

    def test_a_context_with_values_it_cannot_key_is_always_asked(self) -> None:
        member = _ctx("p1", "member")
        values = dict(member.to_policy_values())
        values["odd"] = {"nested": "dict"}
        member.to_policy_values = lambda: values  # type: ignore[method-assign]
        self.allowed(RULE, member)
        self.allowed(RULE, member)
        self.assertEqual(2, self.enforcer.asked)
