"""``trusted-puppet-autosign``: Puppet's policy-based autosign executable.

Puppet runs ``autosign = <executable>`` for every certificate request with
the certname as the only argument and the request (PEM) on standard input,
and signs the certificate only if the executable exits with status 0.
This one signs a request only when

* the certname maps to a node UUID (``[puppet_autosign]
  certname_template``),
* the request is well formed, self-signed correctly and names that
  certname as its subject,
* the verifier (``GET /v1/nodes/<uuid>``, mutual TLS) reports the node in
  an accepted state (``attested``), and
* when configured, the request carries the node UUID in Puppet's
  ``pp_uuid`` extension and/or the expected challengePassword.

Anything else (an unknown, revoked or failed node, a verifier that cannot
be reached, a bad request) exits non-zero with the reason on standard
error, which puppetserver writes to its log.

Puppet passes no options, so the configuration comes from oslo.config's
default files (``/etc/trusted-cloud/trusted-puppet-autosign.conf``, ...) or
from ``--config-file`` in a wrapper script.
"""

from __future__ import annotations

import dataclasses
import hmac
import sys
import urllib.parse

from cryptography import x509
from cryptography.x509.oid import AttributeOID, NameOID
from oslo_config import cfg

from ipsec_puppet_vault_hooks._certname import CertnameTemplate
from ipsec_puppet_vault_hooks.conf import puppet_autosign as autosign_conf
from verifier.common import config, version
from verifier.common import tls as tlsutil
from verifier.common.errors import TransportError
from verifier.common.http import BlockingClient

__all__ = ["PP_UUID_OID", "SigningDecision", "check_request", "main"]

PROG = "trusted-puppet-autosign"
PROJECT = "trusted-cloud"
PP_UUID_OID = x509.ObjectIdentifier("1.3.6.1.4.1.34380.1.1.1")
_MAX_CSR = 64 * 1024


@dataclasses.dataclass(frozen=True)
class SigningDecision:
    """Whether to sign, and why (the reason is shown to the operator)."""

    sign: bool
    reason: str

    def __bool__(self) -> bool:
        return self.sign


def _utf8_string(der: bytes) -> str | None:
    """The text of a DER UTF8String (how Puppet encodes its extensions)."""
    if len(der) < 2 or der[0] != 0x0C:
        return None
    length, offset = der[1], 2
    if length & 0x80:
        n = length & 0x7F
        if n == 0 or n > 2 or len(der) < 2 + n:
            return None
        length, offset = int.from_bytes(der[2 : 2 + n], "big"), 2 + n
    if len(der) != offset + length:
        return None
    try:
        return der[offset:].decode("utf-8")
    except UnicodeDecodeError:
        return None


def _parse_csr(certname: str, pem: bytes) -> x509.CertificateSigningRequest | str:
    """The request, or why it is refused."""
    try:
        csr = x509.load_pem_x509_csr(pem)
    except ValueError as exc:
        return f"malformed certificate request: {exc}"
    if not csr.is_signature_valid:
        return "the certificate request's signature does not verify"
    names = csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if [n.value for n in names] != [certname]:
        return f"the request's subject is not CN={certname}"
    return csr


def _check_extras(
    csr: x509.CertificateSigningRequest, uuid: str, opts: cfg.ConfigOpts.GroupAttr
) -> str | None:
    """Why the optional CSR checks fail, or None when they pass."""
    if opts.require_pp_uuid:
        try:
            ext = csr.extensions.get_extension_for_oid(PP_UUID_OID)
        except x509.ExtensionNotFound:
            return "the request has no pp_uuid extension"
        except ValueError as exc:
            return f"the request's extensions are malformed: {exc}"
        value = ext.value
        raw = value.value if isinstance(value, x509.UnrecognizedExtension) else b""
        text = _utf8_string(raw)
        if text is None or text.strip().lower() != uuid:
            return f"the request's pp_uuid extension is not {uuid}"
    if opts.challenge_password:
        try:
            attr = csr.attributes.get_attribute_for_oid(AttributeOID.CHALLENGE_PASSWORD)
        except x509.AttributeNotFound:
            return "the request has no challengePassword"
        given = attr.value if isinstance(attr.value, bytes) else attr.value.encode()
        if not hmac.compare_digest(given, opts.challenge_password.encode()):
            return "the request's challengePassword is wrong"
    return None


def check_request(
    conf: cfg.ConfigOpts, certname: str, csr_pem: bytes
) -> SigningDecision:
    """Decide whether to sign ``certname``'s request.

    Args:
        conf: configuration with the ``[puppet_autosign]`` group registered.
        certname: the certname Puppet passed.
        csr_pem: the certificate request Puppet passed on standard input.

    Returns:
        The verdict; never raises for bad input or an unreachable verifier.
    """
    opts = conf.puppet_autosign
    try:
        template = CertnameTemplate(opts.certname_template)
    except ValueError as exc:
        return SigningDecision(False, f"configuration: {exc}")
    uuid = template.uuid(certname)
    if uuid is None:
        return SigningDecision(
            False,
            f"certname {certname!r} does not match {opts.certname_template!r}",
        )
    csr = _parse_csr(certname, csr_pem)
    if isinstance(csr, str):
        return SigningDecision(False, csr)
    problem = _check_extras(csr, uuid, opts)
    if problem:
        return SigningDecision(False, problem)
    if not (opts.verifier_url and opts.cert_file and opts.key_file and opts.ca_file):
        return SigningDecision(
            False,
            "configuration: [puppet_autosign] verifier_url, cert_file, key_file "
            "and ca_file must be set",
        )
    url = opts.verifier_url.rstrip("/") + "/v1/nodes/" + urllib.parse.quote(uuid)
    if not url.startswith("https://"):
        return SigningDecision(False, f"configuration: refusing a non-HTTPS URL: {url}")
    try:
        context = tlsutil.client_context(opts.cert_file, opts.key_file, opts.ca_file)
        resp = BlockingClient(context, opts.timeout).request("GET", url)
    except (TransportError, OSError) as exc:
        return SigningDecision(False, f"verifier unreachable: {exc}")
    data = resp.data
    if resp.status == 404:
        return SigningDecision(False, f"node {uuid} is not enrolled with the verifier")
    if resp.status != 200 or not isinstance(data, dict):
        return SigningDecision(
            False, f"verifier answered {resp.status} for node {uuid}: {resp.text()}"
        )
    state = data.get("state")
    if state not in opts.accepted_states:
        return SigningDecision(False, f"node {uuid} is {state}, not attested")
    return SigningDecision(True, f"node {uuid} is {state}")


def main(argv: list[str] | None = None) -> int:
    """Entry point: exit 0 to sign, 1 to refuse, 2 on a usage error."""
    version.exit_if_asked(argv, "trusted-puppet-autosign")
    conf = cfg.ConfigOpts()
    autosign_conf.register_opts(conf)
    conf.register_cli_opt(
        cfg.StrOpt(
            "certname",
            positional=True,
            help="The certname of the request (Puppet passes it); the request "
            "itself (PEM) is read from standard input.",
        )
    )
    try:
        # one line naming the option or file and exit 2 for any
        # configuration error, every option's value checked at start
        config.load(
            conf,
            argv,
            PROG,
            description="Puppet autosign policy: sign a certificate request only "
            "for a node the verifier reports attested.",
        )
    except SystemExit as exc:  # --help, or a usage or configuration error
        return exc.code if isinstance(exc.code, int) else 2
    if not conf.certname:
        print(f"{PROG}: no certname given", file=sys.stderr)
        return 2
    csr_pem = sys.stdin.buffer.read(_MAX_CSR + 1)
    if len(csr_pem) > _MAX_CSR:
        verdict = SigningDecision(False, "certificate request too large")
    else:
        verdict = check_request(conf, conf.certname, csr_pem)
    stream = sys.stdout if verdict else sys.stderr
    action = "signing" if verdict else "refusing"
    print(f"{PROG}: {action} {conf.certname}: {verdict.reason}", file=stream)
    return 0 if verdict else 1
