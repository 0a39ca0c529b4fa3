"""A swtpm local CA (a compute host's, the trial mode's, the tests'): the
configuration ``swtpm_setup``
and ``swtpm_localca`` run with (the way libvirt runs them, but kept in a
directory of the caller's, never ``/etc/swtpm-localca.conf``), the CA
certificates that sign the vTPMs' EK certificates, and free local ports
for a short-lived swtpm.

On first use ``swtpm_localca`` creates, inside ``localca_dir``:

* ``swtpm-localca-rootca-privkey.pem`` / ``swtpm-localca-rootca-cert.pem``:
  a self-signed root CA;
* ``signkey.pem`` / ``issuercert.pem``: the intermediate CA that signs the EK
  and platform certificates;
* ``certserial``: the serial number of the next certificate;
* ``.lock.swtpm-localca``: a lock file, so several TPMs may share one CA.
"""

from __future__ import annotations

import collections
import os
import random
import shutil
import socket
import tempfile

from verifier.common.errors import TpmError

__all__ = ["ek_ca_bundle", "free_port_pair", "free_ports", "write_localca_config"]

_HOST = "127.0.0.1"
_SETUP_CONF = "swtpm_setup.conf"
_LOCALCA_CONF = "swtpm-localca.conf"
_LOCALCA_OPTIONS = "swtpm-localca.options"
_ISSUER_CERT = "issuercert.pem"
_ROOT_CERT = "swtpm-localca-rootca-cert.pem"


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


#: The ports this process handed out last: a probed port is not reserved,
#: so two callers that probe before either binds could get the same one
#: (bounded: a long-lived vTPM manager starts swtpm again and again).
_HANDED_OUT: collections.deque[int] = collections.deque(maxlen=1024)


def free_ports(count: int = 1) -> int:
    """Find a TCP port P such that P .. P + count - 1 are free on 127.0.0.1.

    The ports are chosen at random *below* the kernel's ephemeral range: a
    port probed with ``bind(0)`` and released comes from that range, where
    any outgoing connection or other ``bind(0)`` on the machine may take it
    before the service binds it (seen as flaky tests when several suites
    run at once). Ports are only probed, not reserved; a port this process
    handed out recently is not handed out again.

    Returns:
        The port P.

    Raises:
        TpmError: If no free run of ports was found.
    """
    top = max(_ephemeral_low() - count, 10001)
    for _ in range(200):
        port = random.randrange(10000, top)  # noqa: S311 (not a secret)
        if any(p in _HANDED_OUT for p in range(port, port + count)):
            continue
        sockets = [
            socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)
        ]
        try:
            for i, sock in enumerate(sockets):
                sock.bind((_HOST, port + i))
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
        _HANDED_OUT.extend(range(port, port + count))
        return port
    raise TpmError(f"no {count} free consecutive TCP ports found on {_HOST}")


def free_port_pair() -> int:
    """A port P such that P and P + 1 are free (swtpm's server and control
    ports); see :func:`free_ports`."""
    return free_ports(2)


def _write_atomic(path: str, content: str) -> None:
    """Write ``content`` to ``path`` through a temporary file and a rename."""
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(content)
    os.replace(tmp, path)


def write_localca_config(localca_dir: str) -> str:
    """Write swtpm_setup and swtpm_localca configuration into ``localca_dir``.

    Args:
        localca_dir: Directory holding the local CA; created if missing.

    Returns:
        The path of the swtpm_setup configuration file to pass to ``--config``.
    """
    ca_dir = os.path.abspath(localca_dir)
    os.makedirs(ca_dir, exist_ok=True)
    localca_conf = os.path.join(ca_dir, _LOCALCA_CONF)
    options = os.path.join(ca_dir, _LOCALCA_OPTIONS)
    setup_conf = os.path.join(ca_dir, _SETUP_CONF)
    _write_atomic(
        localca_conf,
        f"statedir = {ca_dir}\n"
        f"signingkey = {os.path.join(ca_dir, 'signkey.pem')}\n"
        f"issuercert = {os.path.join(ca_dir, _ISSUER_CERT)}\n"
        f"certserial = {os.path.join(ca_dir, 'certserial')}\n",
    )
    _write_atomic(
        options,
        "--platform-manufacturer TrustedCloud\n"
        "--platform-version 2.1\n"
        "--platform-model swtpm\n",
    )
    _write_atomic(
        setup_conf,
        f"create_certs_tool = {shutil.which('swtpm_localca') or 'swtpm_localca'}\n"
        f"create_certs_tool_config = {localca_conf}\n"
        f"create_certs_tool_options = {options}\n"
        "active_pcr_banks = sha256\n",
    )
    return setup_conf


def ek_ca_bundle(localca_dir: str) -> bytes:
    """Return the PEM CA certificates that sign EK certificates.

    Args:
        localca_dir: The local CA directory used by :class:`Swtpm`.

    Returns:
        The issuer (intermediate) certificate followed by the root CA
        certificate when there is one, PEM encoded.

    Raises:
        TpmError: If the local CA has not been created yet.
    """
    bundle = b""
    for name in (_ISSUER_CERT, _ROOT_CERT):
        path = os.path.join(localca_dir, name)
        try:
            with open(path, "rb") as pem:
                data = pem.read()
        except FileNotFoundError:
            if name == _ISSUER_CERT:
                raise TpmError(f"ek_ca_bundle: no local CA in {localca_dir}")
            continue
        bundle += data if data.endswith(b"\n") else data + b"\n"
    return bundle
