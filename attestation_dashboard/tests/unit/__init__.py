"""Unit tests of the dashboard's views, with Horizon's test helpers and a
real HTTP server on loopback standing in for the attestation API.

stestr runs them as plain unittest tests: Django is set up here, as its
own test runner would (test environment: ``testserver`` host, in-memory
e-mail, template instrumentation).
"""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "attestation_dashboard.tests.settings")

import django  # noqa: E402
from django.test import utils  # noqa: E402

django.setup()
if not getattr(utils, "_attestation_test_environment", False):
    utils.setup_test_environment()
    utils._attestation_test_environment = True  # type: ignore[attr-defined]
