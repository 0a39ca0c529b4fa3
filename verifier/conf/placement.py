"""Options of the verifier's Placement client (group ``placement``).

The verifier puts a custom trait on the compute node resource provider of
each attested host (trusted compute pools, issue 29). Authentication,
session and endpoint options are keystoneauth's, as in Nova's own
``[placement]`` group (without the version options: the client knows the
microversion it needs); ``noauth`` is for a Placement that runs without
``authtoken`` (tests, a devstack without Keystone).
"""

from __future__ import annotations

import copy

from keystoneauth1 import loading as ks_loading
from oslo_config import cfg

GROUP = "placement"
SERVICE_TYPE = "placement"
#: Adapter options about API versions: the client knows what it needs.
_VERSION_OPTS = {"version", "min_version", "max_version"}

_OPTS = [
    cfg.BoolOpt(
        "trait_sync",
        default=False,
        help="Keep the trait of [placement] trait on the resource provider of "
        "each attested host, and off every other host's. Needs the "
        "keystoneauth options of this group (or noauth).",
    ),
    cfg.StrOpt(
        "trait",
        default="CUSTOM_ATTESTATION_TRUSTED",
        regex=r"^CUSTOM_[A-Z0-9_]{1,248}$",
        help="The custom trait an attested host carries (a flavor asks for "
        "it with trait:CUSTOM_ATTESTATION_TRUSTED=required).",
    ),
    cfg.FloatOpt(
        "retry_interval",
        default=10.0,
        min=0.1,
        help="Seconds before a trait change Placement refused or could not "
        "take (down, conflict) is tried again; it is retried until it lands.",
    ),
    cfg.IntOpt(
        "conflict_retries",
        default=4,
        min=1,
        max=100,
        help="Read-modify-write attempts per change when Placement answers 409 "
        "placement.concurrent_update (another writer changed the provider).",
    ),
    cfg.BoolOpt(
        "noauth",
        default=False,
        help="Talk to a Placement without authtoken (auth_strategy noauth2) at "
        "endpoint_override, sending X-Auth-Token: admin and X-Roles: "
        "admin,service. For tests only.",
    ),
]


def _adapter_opts() -> list[cfg.Opt]:
    opts = [
        opt
        for opt in ks_loading.get_adapter_conf_options(include_deprecated=False)
        if opt.dest not in _VERSION_OPTS
    ]
    cfg.set_defaults(
        opts, valid_interfaces=["internal", "public"], service_type=SERVICE_TYPE
    )
    return opts


def _unset(_: str) -> None:
    return None


def _password_opts() -> list[cfg.Opt]:
    """The password plugin's options, for the sample file only (the plugin
    ``auth_type`` names registers its own when it loads): none required,
    so that a configuration using another plugin still parses."""
    opts = []
    for opt in ks_loading.get_auth_plugin_conf_options("password"):
        opt = copy.deepcopy(opt)
        opt.required = False
        opts.append(opt)
    return opts


def register_opts(conf: cfg.ConfigOpts) -> None:
    """Register the group's own and keystoneauth's options on ``conf``."""
    ks_loading.register_session_conf_options(conf, GROUP)
    ks_loading.register_auth_conf_options(conf, GROUP)
    conf.register_opts(_adapter_opts(), group=GROUP)
    # keystoneauth's adapter loader reads the version options: present, but
    # not settable (as Nova does)
    for name in sorted(_VERSION_OPTS):
        conf.register_opt(cfg.Opt(name, type=_unset), group=GROUP)  # type: ignore[arg-type]
    conf.register_opts(_OPTS, group=GROUP)


def list_opts() -> list[tuple[str, list[cfg.Opt]]]:
    return [
        (
            GROUP,
            _OPTS
            + ks_loading.get_session_conf_options()
            + ks_loading.get_auth_common_conf_options()
            + _password_opts()
            + _adapter_opts(),
        )
    ]
