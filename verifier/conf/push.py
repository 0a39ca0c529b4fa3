"""Push attestation of the verifier (group ``push``): the endpoint node
agents post evidence to when the verifier cannot reach them
(:mod:`verifier.api.push_app`, :mod:`verifier.protocol.push`)."""

from oslo_config import cfg

GROUP = "push"

_OPTS: list[cfg.Opt] = [
    cfg.PortOpt(
        "port",
        default=0,
        help="Port of the push endpoint (HTTPS, server certificate only: agents "
        "authenticate with their TPM). 0 disables push attestation; nodes "
        "enrolled in push mode then fail by their deadline.",
    ),
    cfg.FloatOpt(
        "challenge_ttl",
        default=30.0,
        min=0.1,
        help="Seconds an agent has to answer a challenge.",
    ),
    cfg.FloatOpt(
        "min_interval",
        default=1.0,
        min=0.0,
        help="Least seconds between two challenges, and between two evidence "
        "posts, of one node (the follow-up of incomplete evidence excepted); "
        "more frequent ones are refused with 429.",
    ),
    cfg.FloatOpt(
        "session_ttl",
        default=3600.0,
        min=1.0,
        help="Seconds a session opened with the node's AK lasts.",
    ),
    cfg.FloatOpt(
        "keepalive",
        default=75.0,
        min=1.0,
        help="Seconds an agent's connection is kept open after an answer, for "
        "its next request. Longer than the agents' interval saves a TLS "
        "handshake a round, at the cost of an open connection per agent.",
    ),
    cfg.FloatOpt(
        "request_timeout",
        default=120.0,
        min=1.0,
        help="Seconds a request has to arrive whole from its first byte; the "
        "connection of a slower client is closed.",
    ),
    cfg.IntOpt(
        "max_evidence_bytes",
        default=48 << 20,
        min=4096,
        help="Largest evidence post (refused with 413 above): the IMA list "
        "part an agent sends at most (32 MiB encoded) plus the firmware log.",
    ),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_opts(_OPTS, group=GROUP)


def list_opts() -> list[tuple[str, list[cfg.Opt]]]:
    return [(GROUP, _OPTS)]
