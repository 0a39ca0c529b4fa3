"""verifier.common.extras: the line naming the extra a feature needs."""

from __future__ import annotations

import sys
from unittest import mock

import testtools

from verifier.common import extras


class ExtrasTest(testtools.TestCase):
    def test_require_names_feature_module_and_extra(self) -> None:
        with mock.patch.dict(sys.modules, {"redis": None}):
            exc = self.assertRaises(
                extras.MissingExtraError, extras.require, "scale", "several verifiers"
            )
        self.assertEqual(("scale", "redis"), (exc.extra, exc.module))
        self.assertEqual(
            "several verifiers needs the 'scale' extra (redis is not installed): "
            "pip install 'trusted-cloud[scale]'",
            str(exc),
        )

    def test_require_passes_when_installed(self) -> None:
        extras.require("abe", "sealing")  # pymcl is in the test environment

    def test_explain_maps_driver_and_role_modules(self) -> None:
        for module, extra in (("hvac.api", "vault"), ("libvirt", "vtpm")):
            exc = ModuleNotFoundError(f"No module named {module!r}", name=module)
            self.assertIn(f"pip install 'trusted-cloud[{extra}]'", extras.explain(exc))

    def test_explain_leaves_other_errors_alone(self) -> None:
        other = ModuleNotFoundError("No module named 'requests'", name="requests")
        self.assertEqual("No module named 'requests'", extras.explain(other))
        self.assertEqual("boom", extras.explain(ValueError("boom")))
        self.assertEqual("KeyError", extras.explain(KeyError()))
