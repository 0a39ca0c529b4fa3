"""Options of the vTPM manager (group ``vtpm_manager``)."""

import socket

from oslo_config import cfg

GROUP = "vtpm_manager"

_OPTS = [
    cfg.StrOpt(
        "libvirt_uri",
        default="qemu:///system",
        help="libvirt connection URI of the compute host.",
    ),
    cfg.StrOpt(
        "swtpm_storage_dir",
        default="/var/lib/libvirt/swtpm",
        help="Where libvirt keeps swtpm states (<dir>/<domain uuid>/tpm2): "
        "/var/lib/libvirt/swtpm for qemu:///system, <root>/lib/swtpm for "
        "qemu:///embed?root=<root>.",
    ),
    cfg.StrOpt(
        "localca_dir",
        default="/var/lib/trusted-cloud/vtpm-localca",
        help="The compute host's local CA signing vTPM EK certificates "
        "(swtpm_localca); its issuercert.pem and root certificate belong in "
        "the registrar's [registrar]/ek_ca_bundle.",
    ),
    cfg.StrOpt(
        "localca_conf",
        default="/etc/swtpm-localca.conf",
        help="swtpm_localca configuration of the CA libvirt's swtpm_setup "
        "signs Nova's vTPM EK certificates with (its issuercert); "
        "enrol-host enrols that CA with the registrar.",
    ),
    cfg.StrOpt(
        "host",
        default=socket.gethostname(),
        sample_default="<hostname>",
        help="This compute host's name in Nova ([DEFAULT]/host of its "
        "nova-compute): the name its CA is enrolled under.",
    ),
    cfg.StrOpt(
        "ek_alg",
        default="rsa",
        choices=["rsa", "ecc"],
        help="The EK registered; must match the guest agent's [agent]/ek_alg.",
    ),
    cfg.StrOpt(
        "default_model",
        default="tpm-crb",
        choices=["tpm-crb", "tpm-tis"],
        help="TPM model of a device the manager adds (Nova: hw:tpm_model).",
    ),
    cfg.BoolOpt(
        "keep_state",
        default=False,
        help="Keep a vTPM's state when its domain is undefined.",
    ),
    cfg.BoolOpt(
        "hook_fail_closed",
        default=True,
        help="The libvirt hook refuses to start a domain whose vTPM EK "
        "cannot be registered (otherwise it only logs).",
    ),
    cfg.StrOpt(
        "registrar_url",
        default="https://127.0.0.1:8891",
        help="Base URL of the registrar (https: mTLS with cert_file).",
    ),
    cfg.StrOpt("cert_file", help="PEM client certificate (role provider)."),
    cfg.StrOpt("key_file", help="PEM private key of cert_file."),
    cfg.StrOpt("ca_file", help="PEM CA bundle the registrar's certificate chains to."),
    cfg.IntOpt(
        "registrar_retries",
        default=4,
        min=0,
        help="Retries of a registrar call on transport errors or 5xx.",
    ),
    cfg.FloatOpt(
        "registrar_backoff",
        default=0.5,
        min=0.0,
        help="First retry delay in seconds; it doubles on each retry.",
    ),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_opts(_OPTS, group=GROUP)


def list_opts() -> list[tuple[str, list[cfg.Opt]]]:
    return [(GROUP, _OPTS)]
