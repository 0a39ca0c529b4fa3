"""Unit tests of the dashboard's views, with Horizon's test helpers and a
real HTTP server on loopback standing in for the attestation API.

stestr runs them as plain unittest tests: Django is set up here, as its
own test runner would (test environment: ``testserver`` host, in-memory
e-mail, template instrumentation).
"""

import os
import socket

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "attestation_dashboard.tests.settings")

import django  # noqa: E402
from django.test import utils  # noqa: E402

# horizon.test.settings (which ours extend) sets a 1 s default timeout on
# every socket of the process: stestr's worker runs other classes after
# these in the same process (the Nova story's in-process trusted-nova boot
# then timed out on every call and never saw its agent register)
_timeout = socket.getdefaulttimeout()
django.setup()
socket.setdefaulttimeout(_timeout)
if not getattr(utils, "_attestation_test_environment", False):
    utils.setup_test_environment()
    utils._attestation_test_environment = True  # type: ignore[attr-defined]
