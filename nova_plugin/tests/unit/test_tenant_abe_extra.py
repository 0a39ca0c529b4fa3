"""``trusted-tenant`` without the ``abe`` extra: sealing to a policy is
refused in one line naming the extra (exit 2) before anything is read or
sent; handing a sealed blob to a node does not need the extra."""

from __future__ import annotations

import sys
from unittest import mock

import testtools

from nova_plugin import policy_seal
from nova_plugin.tests.unit.test_tenant_cli import run_tenant
from verifier.common import extras

_SETTINGS = [
    "--verifier=https://127.0.0.1:1",
    "--cert=/nonexistent/c.pem",
    "--key=/nonexistent/k.pem",
    "--ca=/nonexistent/ca.pem",
]


class SealWithoutAbeTest(testtools.TestCase):
    def test_seal_names_the_extra_in_one_line_and_exits_2(self) -> None:
        argv = [*_SETTINGS, "seal", "--seal-policy", "region=eu"]
        argv += ["--payload", "/nonexistent/p", "--out", "/nonexistent/o"]
        with mock.patch.dict(sys.modules, {"pymcl": None}):
            code, err = run_tenant(argv)
        self.assertEqual(2, code)
        self.assertEqual(1, len(err.strip().splitlines()), err)
        self.assertIn("pip install 'trusted-cloud[abe]'", err)
        self.assertNotIn("Traceback", err)

    def test_seal_with_the_extra_goes_on_to_load_the_settings(self) -> None:
        argv = [*_SETTINGS, "seal", "--seal-policy", "region=eu"]
        argv += ["--payload", "/nonexistent/p", "--out", "/nonexistent/o"]
        code, err = run_tenant(argv)
        # fails on the missing certificate files, past the extra check (a
        # usage error naming the option: exit 2)
        self.assertEqual(2, code)
        self.assertIn("No such file", err)
        self.assertNotIn("trusted-cloud[abe]", err)

    def test_library_refuses_to_seal_without_the_extra(self) -> None:
        with mock.patch.dict(sys.modules, {"pymcl": None}):
            self.assertRaises(
                extras.MissingExtraError,
                policy_seal.seal_to_policy,
                None,  # type: ignore[arg-type]
                "region=eu",
                b"x",
            )

    def test_send_sealed_does_not_need_the_extra(self) -> None:
        argv = [*_SETTINGS, "--registrar=https://127.0.0.1:1", "send-sealed"]
        argv += ["00000000-0000-4000-8000-000000000001", "--blob", "/nonexistent/b"]
        with mock.patch.dict(sys.modules, {"pymcl": None}):
            code, err = run_tenant(argv)
        # fails on the missing certificate files, not on the missing extra
        self.assertEqual(2, code)
        self.assertIn("No such file", err)
        self.assertNotIn("trusted-cloud[abe]", err)
