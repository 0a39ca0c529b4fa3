"""The test harness's ``wait_until``: a timeout is an error, never a
falsy value a caller could mistake for success."""

from __future__ import annotations

import itertools

import testtools

from trusted_testing.procs import WaitTimeoutError, wait_until


class WaitUntilTest(testtools.TestCase):
    def test_returns_the_first_truthy_value(self) -> None:
        calls = itertools.count()
        self.assertEqual(3, wait_until(lambda: (n := next(calls)) >= 3 and n, 5, 0.001))

    def test_timeout_raises_naming_what_and_the_last_value(self) -> None:
        exc = self.assertRaises(
            WaitTimeoutError,
            wait_until,
            lambda: [],
            0.05,
            0.01,
            "node 3 registered",
        )
        self.assertIsInstance(exc, AssertionError)
        self.assertEqual(
            "node 3 registered not within 0.05 s (last value: [])", str(exc)
        )
        self.assertEqual([], exc.last)

    def test_unnamed_wait_names_the_predicate(self) -> None:
        def agent_started() -> bool:
            return False

        exc = self.assertRaises(WaitTimeoutError, wait_until, agent_started, 0.01, 0.01)
        self.assertIn("agent_started", str(exc))
