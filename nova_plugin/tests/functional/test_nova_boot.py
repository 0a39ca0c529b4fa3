"""Trusted boot through real Nova 34, in-process Nova functional
environment: the cases are in :mod:`nova_boot_cases` and run in a process
of their own (see :mod:`_isolated` for why); each is reported here."""

from __future__ import annotations

import os

from trusted_testing.nova import isolated as _isolated

_CASES = "nova_plugin.tests.functional.nova_boot_cases"
_PATH = os.path.join(os.path.dirname(__file__), "nova_boot_cases.py")

TrustedNovaBootTest = _isolated.wrapper(_CASES, _PATH)
TrustedNovaBootTest.__name__ = TrustedNovaBootTest.__qualname__ = "TrustedNovaBootTest"
TrustedNovaBootTest.__module__ = __name__
