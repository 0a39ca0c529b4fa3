"""The dashboard's tests share stestr's worker process with every other
test class: they must leave the process as they found it."""

import socket

import testtools

import attestation_dashboard.tests.unit  # noqa: F401 (sets Django up)


class ProcessStateTest(testtools.TestCase):
    def test_horizon_test_settings_leave_the_socket_timeout_alone(self) -> None:
        # horizon.test.settings sets 1 s on every socket of the process;
        # the Nova story's in-process boot, run later in the same worker,
        # then never saw its agent register
        self.assertIsNone(socket.getdefaulttimeout())
