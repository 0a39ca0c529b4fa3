"""The compute host's swtpm local CA, as libvirt's ``swtpm_setup`` uses it.

libvirt runs ``swtpm_setup --create-ek-cert`` with the machine's
``/etc/swtpm_setup.conf``, whose ``create_certs_tool_config`` is
``/etc/swtpm-localca.conf``; that file names the CA that signs every vTPM
EK certificate on this host (``issuercert``, an intermediate made by
``swtpm_localca`` on first use, under ``statedir`` beside its root
``swtpm-localca-rootca-cert.pem``). Enrolling that CA with the registrar
under the host's Nova name binds the EKs of the vTPMs Nova makes here to
this host, without reading any vTPM state.
"""

from __future__ import annotations

import os

from verifier.protocol.ekcert import MAX_HOST_CA_PEM, load_host_ca
from verifier.protocol.errors import MalformedError
from vtpm_manager.exceptions import HostCaError

__all__ = ["DEFAULT_LOCALCA_CONF", "read_host_ca"]

DEFAULT_LOCALCA_CONF = "/etc/swtpm-localca.conf"
_ROOT_CERT = "swtpm-localca-rootca-cert.pem"


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_HOST_CA_PEM + 1)
    except OSError as exc:
        raise HostCaError(f"cannot read {what} {path}: {exc.strerror or exc}")
    return data if data.endswith(b"\n") else data + b"\n"


def _parse_conf(text: str, path: str) -> dict[str, str]:
    """``key = value`` lines (``#`` comments), as swtpm_localca reads them."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise HostCaError(f"{path}: not 'key = value': {line[:60]!r}")
        values[key.strip()] = value.strip()
    return values


def read_host_ca(localca_conf: str = DEFAULT_LOCALCA_CONF) -> str:
    """The PEM of this host's vTPM EK CA: issuer certificate, then its root
    if ``swtpm_localca`` made one.

    Raises:
        HostCaError: the configuration or a certificate cannot be read, the
            CA was not made yet (no vTPM was ever set up here), or it is not
            a CA certificate.
    """
    try:
        conf = _parse_conf(
            _read(localca_conf, "swtpm local CA config").decode(), localca_conf
        )
    except UnicodeDecodeError:
        raise HostCaError(f"{localca_conf}: not a text file")
    issuer = conf.get("issuercert")
    if not issuer:
        raise HostCaError(f"{localca_conf} names no issuercert")
    if not os.path.exists(issuer):
        raise HostCaError(
            f"{issuer} does not exist: swtpm_localca makes the CA when the "
            "first vTPM is set up on this host (or run swtpm_setup once)"
        )
    pem = _read(issuer, "the issuer certificate")
    statedir = conf.get("statedir") or os.path.dirname(issuer)
    root = os.path.join(statedir, _ROOT_CERT)
    if os.path.exists(root) and os.path.abspath(root) != os.path.abspath(issuer):
        pem += _read(root, "the root certificate")
    try:
        load_host_ca(pem)
    except MalformedError as exc:
        raise HostCaError(f"{issuer}: {exc}")
    return pem.decode("ascii", errors="replace")
