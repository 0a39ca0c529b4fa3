"""The host gate with the trust coming from the real verifier (trusted
compute pools, issue 29), without Nova.

An emulated compute host (:class:`trusted_testing.hosttpm.EmulatedHost`)
runs the real host agent on its platform swtpm; the operator enrols it with
the verifier (``POST /v1/hosts``, its runtime and measured-boot policies
made from the host) and its swtpm local CA with the registrar
(``[registrar] host_trust = required``). The verifier attests the host and
tells the registrar its trust and proven CA digest; then

* a vTPM made on the host registers (the node agent's own registration
  code on the vTPM's swtpm);
* an unknown program runs on the host: the verifier fails it, tells the
  registrar, and a new vTPM from the host's CA is refused with
  ``host_untrusted`` while what is registered stays.

The verifier's compute host API is i29-hosts' work: without it (this
branch alone) the test is skipped.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, ClassVar

from node_agent.exceptions import RegistrationError
from trusted_testing.hostgate import (
    GATE_VERIFIER_OPTIONS,
    enrol_host,
    enrol_host_ca,
    https_call,
)
from trusted_testing.hosttpm import VendorCa
from verifier.tests.functional.test_host_ca_gate import HOST, GateFixture


def _until(what: str, test: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not test():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


class _HostGateSteps:
    """One registrar, one verifier, one emulated compute host per class; the
    tests run in name order and build on each other (the last one tampers
    with the host: each concrete class its own way)."""

    kept: ClassVar[str]
    verifier_options: ClassVar[dict[str, Any]] = GATE_VERIFIER_OPTIONS

    def verifier(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """``method path`` on the verifier with the operator's certificate."""
        url = self.cluster.verifier_url + path
        return https_call(self.cluster, "operator", method, url, body)

    def trust(self) -> Any:
        status, data = self.call("verifier", "GET", f"/v1/hosts/{HOST}/trust")
        self.assertEqual(200, status, data)
        return data

    def test_1_host_enrolled_with_both_services_and_its_agent_running(self) -> None:
        self.new_vtpm()  # swtpm_localca makes the CA and reads it: measured
        enrol_host_ca(self.cluster, self.host)
        self.start_host_agent()
        enrol_host(
            self.cluster, self.host, self.provider, os.path.join(self.tmp, "policies")
        )
        status, data = self.verifier("GET", f"/v1/hosts/{self.provider}")
        self.assertEqual(200, status, data)

    def test_2_the_verifier_reports_the_host_trusted_with_its_proven_ca(
        self,
    ) -> None:
        _until("the host trusted at the registrar", lambda: self.trust()["trusted"])
        self.assertEqual(self.host.proven_ca_sha256(), self.trust()["ca_sha256"])
        self.assertEqual(self.provider, self.trust()["provider"])

    def test_3_a_vtpm_made_on_the_attested_host_registers(self) -> None:
        uuid, swtpm = self.new_vtpm()
        self.register_vtpm(uuid, swtpm)
        self.assertTrue(self.registered(uuid))
        type(self).kept = uuid

    def assert_new_vtpms_refused_once_untrusted(
        self, tamper: Callable[[], None]
    ) -> None:
        uuid, swtpm = self.new_vtpm()  # certified while the host was good
        tamper()
        _until(
            "the host untrusted at the registrar",
            lambda: not self.trust()["trusted"],
        )
        try:
            self.register_vtpm(uuid, swtpm)
        except RegistrationError as exc:
            self.assertIn("host_untrusted", str(exc))
        else:
            self.fail("a vTPM of an untrusted host registered")
        self.assertFalse(self.registered(uuid))
        self.assertTrue(self.registered(self.kept))  # nothing registered is lost
        status, data = self.verifier("GET", f"/v1/hosts/{self.provider}")
        self.assertEqual(200, status, data)


class UnknownProgramOnHostTest(_HostGateSteps, GateFixture):
    def test_4_an_unknown_program_on_the_host_stops_new_vtpms(self) -> None:
        self.assert_new_vtpms_refused_once_untrusted(
            lambda: self.host.run("/tmp/.x/miner", b"an unknown program")
        )


class SwappedCaOnHostTest(_HostGateSteps, GateFixture):
    def test_4_a_ca_swapped_on_the_host_stops_new_vtpms(self) -> None:
        # the IMA list shows a new digest for the CA file: not in the host
        # policy, the host fails
        self.assert_new_vtpms_refused_once_untrusted(
            lambda: self.host.swap_ca(VendorCa("swtpm-localca").pem())
        )
