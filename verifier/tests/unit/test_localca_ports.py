"""verifier.common.swtpm_localca.free_ports: probed ports are not reserved, so the
same process must not hand out one it handed out a moment ago (the demo's
registrar and a node agent were once given the same port)."""

from __future__ import annotations

import itertools
from unittest import mock

import testtools

from verifier.common import swtpm_localca as localca


class FreePortsTest(testtools.TestCase):
    def test_a_port_handed_out_is_not_handed_out_again(self) -> None:
        picks = itertools.chain([23456, 23456, 23456], itertools.count(23500))
        with mock.patch.object(localca.random, "randrange", lambda a, b: next(picks)):
            first = localca.free_ports(1)
            second = localca.free_ports(1)
        self.assertNotEqual(first, second)

    def test_a_run_overlapping_a_port_handed_out_is_skipped(self) -> None:
        picks = itertools.chain([24600, 24599], itertools.count(24700, 10))
        with mock.patch.object(localca.random, "randrange", lambda a, b: next(picks)):
            first = localca.free_ports(2)  # 24600, 24601
            second = localca.free_ports(2)  # 24599-24600 overlaps: skipped
        self.assertFalse({first, first + 1} & {second, second + 1})
