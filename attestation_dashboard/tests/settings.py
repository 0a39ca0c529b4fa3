"""Django settings of the dashboard's unit tests: Horizon's own test
settings with the attestation panels enabled from this package."""

import openstack_dashboard.enabled
from openstack_dashboard.test.settings import *  # noqa: F403
from openstack_dashboard.utils import settings as settings_utils

import attestation_dashboard.enabled

# Horizon's test settings enabled its own panels: enable them again with ours
_plugins = HORIZON_CONFIG.pop("plugins", [])  # noqa: F405
INSTALLED_APPS = [a for a in INSTALLED_APPS if a not in _plugins]  # noqa: F405
HORIZON_CONFIG.pop("dashboards", None)  # noqa: F405
HORIZON_CONFIG.pop("default_dashboard", None)  # noqa: F405
settings_utils.update_dashboards(
    [openstack_dashboard.enabled, attestation_dashboard.enabled],
    HORIZON_CONFIG,  # noqa: F405
    INSTALLED_APPS,
)

# No test runner creates a test database here: an in-memory one (the
# dashboard stores nothing; Django's TestCase only opens transactions)
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}

# Horizon's test settings check no policy; the dashboard's tests check ours
POLICY_CHECK_FUNCTION = "openstack_auth.policy.check"

# The pages' CSS and JavaScript are not what these tests check: no
# compression (libsass) on each rendering
COMPRESS_ENABLED = False

# These tests share stestr's worker processes with the rest of the suite:
# Django leaves the process's logging as it is (Horizon's test settings
# would stop the propagation of oslo_policy's, stevedore's and the
# clients' loggers for every test of the worker)
LOGGING_CONFIG = None
