"""Options of the node agent (group ``agent``)."""

from oslo_config import cfg

GROUP = "agent"

_OPTS = [
    cfg.StrOpt(
        "uuid",
        help="UUID of this node (the Nova instance UUID). Unset: cloud-init's "
        "instance id (instance_data_file, else instance_id_file), which must "
        "be a UUID.",
    ),
    cfg.StrOpt(
        "bootstrap_file",
        default="/etc/trusted-cloud/bootstrap.json",
        help="The bootstrap configuration cloud-init writes from the "
        "user-data of 'trusted-nova boot' (registrar_url, ca_pem, boot_id). "
        "Its values fill the options left unset here (registrar_url, "
        "ca_file); options set here win. Absent: only these options count. "
        "Empty: not read.",
    ),
    cfg.StrOpt(
        "user_data_file",
        default="/var/lib/cloud/instance/user-data.txt",
        help="cloud-init's copy of the instance user-data (may be gzip). The "
        "sealed payload of 'trusted-nova boot' is taken from it when the "
        "tenant's share U comes without one. Empty: not read.",
    ),
    cfg.StrOpt(
        "instance_data_file",
        default="/run/cloud-init/instance-data.json",
        help="cloud-init's instance data; its v1.instance_id is the node "
        "UUID when 'uuid' is unset.",
    ),
    cfg.StrOpt(
        "instance_id_file",
        default="/var/lib/cloud/data/instance-id",
        help="cloud-init's instance id file, read when 'uuid' is unset and "
        "instance_data_file is absent.",
    ),
    cfg.StrOpt(
        "tcti",
        default="device:/dev/tpmrm0",
        help="TCTI of the TPM, e.g. 'device:/dev/tpmrm0' or "
        "'swtpm:host=127.0.0.1,port=2321'.",
    ),
    cfg.StrOpt(
        "ek_alg",
        default="rsa",
        choices=["rsa", "ecc"],
        help="Algorithm of the endorsement key.",
    ),
    cfg.StrOpt(
        "ak_alg",
        default="ecc",
        choices=["ecc", "rsa"],
        help="Algorithm of the attestation key.",
    ),
    cfg.HostAddressOpt("host", default="127.0.0.1", help="Address to listen on."),
    cfg.PortOpt(
        "port",
        default=9002,
        help="Port to listen on (HTTPS, mTLS). 0 picks a free port.",
    ),
    cfg.HostAddressOpt(
        "contact_host",
        help="Address the registrar tells verifiers and tenants to contact "
        "this agent at (and the subject alternative name of its TLS "
        "certificate). Defaults to 'host', or, when 'host' is a wildcard "
        "(0.0.0.0, ::), to the local address of the route to the registrar.",
    ),
    cfg.PortOpt(
        "contact_port",
        help="Port the registrar tells verifiers and tenants to contact this "
        "agent at, when port forwarding or NAT makes it differ from 'port'. "
        "Defaults to the port listened on.",
    ),
    cfg.StrOpt(
        "registrar_url",
        help="Base URL of the registrar, e.g. https://registrar:8891. Unset: "
        "from bootstrap_file.",
    ),
    cfg.StrOpt(
        "ca_file",
        help="PEM file of the operator CA: it signs the registrar's "
        "certificate and the client certificates allowed to call the agent. "
        "Unset: the ca_pem of bootstrap_file.",
    ),
    cfg.StrOpt(
        "cert_file",
        help="PEM client certificate (from the operator CA) presented to the "
        "registrar. Unset (the usual case in a VM): the agent registers "
        "without one, identified by its TPM; the registrar then requires an "
        "EK certificate that chains to its EK anchors.",
    ),
    cfg.StrOpt("key_file", help="PEM private key of cert_file."),
    cfg.StrOpt(
        "attestation_mode",
        default="pull",
        choices=["pull", "push"],
        help="pull: the verifier polls this agent's quote endpoint. push: the "
        "agent posts its evidence to push_url (the node is enrolled with "
        "mode push); the verifier then never connects to the agent, which "
        "suits nodes on tenant networks it cannot reach. A bootstrap file "
        "that names a push_url (trusted-nova boot --mode push) means push.",
    ),
    cfg.StrOpt(
        "push_url",
        help="Base URL of the verifier's push endpoint ([push] port of the "
        "verifier), e.g. https://verifier:8882; required in push mode. Its "
        "certificate must chain to ca_file.",
    ),
    cfg.StrOpt(
        "work_dir",
        default="/var/lib/trusted-cloud-agent",
        help="Directory of the decrypted payload, its output and status, the "
        "node identity and the agent's TLS key.",
    ),
    cfg.FloatOpt(
        "payload_timeout",
        default=300.0,
        min=1.0,
        help="Seconds an executable payload may run before it is killed.",
    ),
    cfg.ListOpt(
        "tenant_clients",
        default=["tenant"],
        help="Client certificate common names allowed to send the tenant's "
        "share U and the payload.",
    ),
    cfg.ListOpt(
        "verifier_clients",
        default=["verifier"],
        help="Client certificate common names allowed to send the verifier's share V.",
    ),
    cfg.BoolOpt(
        "tpm_shared",
        default=True,
        help="Open the TPM connection for each operation and close it after, "
        "so other local TPM users (e.g. tpm2-tools on a swtpm, which serves "
        "one client at a time) can use the TPM between operations.",
    ),
    cfg.StrOpt(
        "ima_log_path",
        default="/sys/kernel/security/ima/binary_runtime_measurements",
        help="The IMA runtime measurement list sent to the verifier when its "
        "runtime policy asks (a name containing 'binary' selects the binary "
        "form). At the default the agent sends the binary list where it can "
        "read it, else ascii_runtime_measurements beside it (the verifier "
        "parses the binary form at about half the cost). Empty: none.",
    ),
    cfg.IntOpt(
        "ima_max_bytes",
        default=4 << 20,
        min=4096,
        help="The most IMA list bytes sent with one quote; a longer list goes "
        "in parts over several quotes.",
    ),
    cfg.StrOpt(
        "trial_dir",
        default="",
        help="TRIAL MODE, never on a production node: send the IMA list and "
        "event log that 'trusted-trial boot' and 'trusted-trial run' wrote in "
        "this directory instead of ima_log_path and mb_log_path. Refused with "
        "a hardware TPM (a 'device:' tcti).",
    ),
    cfg.StrOpt(
        "mb_log_path",
        default="/sys/kernel/security/tpm0/binary_bios_measurements",
        help="The firmware (UEFI) event log sent to the verifier when its "
        "measured-boot policy asks. Empty: none.",
    ),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_opts(_OPTS, group=GROUP)


def list_opts() -> list[tuple[str, list[cfg.Opt]]]:
    return [(GROUP, _OPTS)]
