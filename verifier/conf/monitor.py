"""Options of monitor attestation (group ``monitor``): the verifier proves
its own integrity to customers with batched TPM quotes."""

from oslo_config import cfg, types

GROUP = "monitor"

_OPTS = [
    cfg.BoolOpt(
        "enabled",
        default=False,
        help="Serve GET /v1/monitor/attest and /v1/monitor/ak from the "
        "verifier host's TPM.",
    ),
    cfg.StrOpt(
        "tcti",
        default="device:/dev/tpmrm0",
        help="TCTI of the verifier host's TPM (e.g. swtpm:host=127.0.0.1,port=2321).",
    ),
    cfg.StrOpt("ek_alg", default="rsa", choices=["rsa", "ecc"], help="EK algorithm."),
    cfg.StrOpt("ak_alg", default="ecc", choices=["ecc", "rsa"], help="AK algorithm."),
    cfg.ListOpt(
        "pcrs",
        item_type=types.Integer(min=0, max=23),
        default=[0, 1, 2, 3, 4, 5, 6, 7],
        help="PCRs (sha256 bank) quoted for customers.",
    ),
    cfg.FloatOpt(
        "window_ms",
        default=5.0,
        min=0.0,
        help="Requests arriving within this many milliseconds of the first "
        "waiting one share one quote (a Merkle tree over their nonces).",
    ),
    cfg.IntOpt(
        "max_batch",
        default=65536,
        min=1,
        max=1 << 20,
        help="Most nonces in one batch (1: one quote per request).",
    ),
    cfg.ListOpt(
        "clients",
        default=[],
        help="Client certificate common names allowed to ask for monitor "
        "attestations, besides the tenant clients.",
    ),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_opts(_OPTS, group=GROUP)


def list_opts() -> list[tuple[str, list[cfg.Opt]]]:
    return [(GROUP, _OPTS)]
