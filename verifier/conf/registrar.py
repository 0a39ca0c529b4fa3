"""Options of the registrar (group ``registrar``)."""

from oslo_config import cfg

GROUP = "registrar"

_OPTS = [
    cfg.HostAddressOpt("host", default="127.0.0.1", help="Address to listen on."),
    cfg.PortOpt(
        "port",
        default=8891,
        help="Port to listen on (HTTPS; client certificates optional, see "
        "ek_ca_bundle).",
    ),
    cfg.StrOpt(
        "database_connection",
        default="sqlite:////var/lib/trusted-cloud/registrar.sqlite",
        help="SQLAlchemy URL of the registrar's database.",
    ),
    cfg.StrOpt("cert_file", help="PEM certificate the registrar presents."),
    cfg.StrOpt("key_file", help="PEM private key of cert_file."),
    cfg.StrOpt(
        "ca_file",
        help="PEM CA bundle of the client certificates. Every endpoint but "
        "registration and activation needs one (in the role it names); "
        "agents without one are identified by their TPM (ek_ca_bundle).",
    ),
    cfg.StrOpt(
        "ek_ca_bundle",
        help="PEM bundle of the CAs that sign EK certificates (e.g. swtpm's "
        "local CA, or TPM vendors' CAs). When set, an EK certificate sent at "
        "registration must chain to one of them and match the EK. Agents "
        "that register without a client certificate (the usual case in a "
        "VM) must send an EK certificate that does; without this option "
        "such registrations are refused.",
    ),
    cfg.ListOpt(
        "agent_clients",
        default=["agent"],
        help="Client certificate common names allowed to register nodes.",
    ),
    cfg.ListOpt(
        "reader_clients",
        default=["verifier", "tenant"],
        help="Client certificate common names allowed to read registrations.",
    ),
    cfg.ListOpt(
        "metrics_clients",
        default=[],
        help="Client certificate common names allowed to scrape GET /metrics "
        "(Prometheus; doc/source/admin/monitoring.rst); admin_clients may too.",
    ),
    cfg.ListOpt(
        "admin_clients",
        default=["admin"],
        help="Client certificate common names allowed to delete registrations.",
    ),
    cfg.ListOpt(
        "provider_clients",
        default=["vtpm-manager"],
        help="Client certificate common names allowed to register vTPM EKs "
        "under instance UUIDs (compute hosts running trusted-vtpm-manager).",
    ),
    cfg.ListOpt(
        "verifier_clients",
        default=["verifier"],
        help="Client certificate common names allowed to tell the registrar "
        "each compute host's trust (PUT /v1/hosts/{host}/trust: the "
        "verifier's service certificates; admin_clients may too).",
    ),
    cfg.StrOpt(
        "host_trust",
        default="required",
        choices=[
            (
                "required",
                "a vTPM EK certificate from a compute host's enrolled CA is "
                "accepted only while the verifier reports that host attested "
                "with that CA file proven in its IMA list (trusted compute "
                "pools); a host it never reported is untrusted",
            ),
            (
                "off",
                "an enrolled host CA is trusted for as long as it stays "
                "enrolled (clouds that do not attest their compute hosts yet)",
            ),
        ],
        help="Whether new registrations of Nova vTPMs need their compute "
        "host attested (doc/source/admin/vtpm.rst). Registrations already "
        "in force are kept either way.",
    ),
    cfg.BoolOpt(
        "require_ek_certificate",
        default=False,
        help="Refuse registrations that carry no EK certificate.",
    ),
    cfg.StrOpt(
        "auth_strategy",
        default="noauth",
        choices=[
            (
                "keystone",
                "tenants read registrations with Keystone tokens "
                "([keystone_authtoken]); each sees only its own project's "
                "instances (asked of Nova); what a cloud runs",
            ),
            (
                "noauth",
                "no Keystone: only reader_clients certificates read "
                "registrations (the embedded demo and tests only)",
            ),
        ],
        help="How tenants authenticate to the registrar's read side. Agents "
        "(their TPM) and the vTPM manager and readers (certificates) are "
        "unchanged.",
    ),
    cfg.StrOpt(
        "instance_owner_check",
        default="nova",
        choices=[
            (
                "nova",
                "a project-scoped caller reads only the registrations of its "
                "project's instances, asked of Nova with its token",
            ),
            (
                "none",
                "no Nova (bare-metal nodes, compute hosts, a trial): a "
                "project-scoped caller reads every registration (public keys "
                "and certificates only; enrolment still ties a node to the "
                "enrolling project at the verifier)",
            ),
        ],
        help="auth_strategy keystone only: how a registration is tied to "
        "the project reading it (the verifier's [verifier] "
        "instance_owner_check is the same choice for enrolments).",
    ),
    cfg.StrOpt(
        "compute_interface",
        default="public",
        help="auth_strategy keystone: the endpoint interface of Nova's "
        "catalog entry used to ask whose an instance is.",
    ),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_opts(_OPTS, group=GROUP)


def list_opts() -> list[tuple[str, list[cfg.Opt]]]:
    return [(GROUP, _OPTS)]
