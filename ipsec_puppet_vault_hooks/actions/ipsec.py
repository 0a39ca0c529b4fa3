"""The ``ipsec`` action: cut a revoked node off a strongSwan gateway.

For a node with a peer mapping (see :mod:`ipsec_puppet_vault_hooks._ipsec.
peers`) it, in this order:

#. adds the serial of the node's certificate to the CRL it keeps
   (``[action_ipsec] crl_file``, signed with the configured CA key);
#. loads that CRL into charon over vici (``load-cert``, type ``x509crl``)
   and flushes charon's cached CRLs (``flush-certs``, type ``x509crl``),
   so an older cached CRL cannot vouch for the certificate;
#. unloads the node's connection (``unload-conn``), so charon neither
   accepts nor initiates it any more;
#. terminates every IKE SA of that connection (``terminate``, forced after
   ``terminate_timeout`` if the node does not answer), which takes its
   CHILD SAs with it, and checks that none is left;
#. rewrites ``[action_ipsec] swanctl_conf`` with the connections of the
   peers that are still trusted.

Every step is idempotent, so a second delivery of the event changes
nothing and succeeds. A node without a mapping is not an IPsec peer: the
action logs that and succeeds. Any failure (charon down, CA unreadable,
malformed mapping) raises :class:`ActionError`, and the consumer retries.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import tempfile
from collections.abc import Iterator
from typing import Any

import vici
import vici.exception
from oslo_config import cfg
from oslo_log import log as logging

from ipsec_puppet_vault_hooks._ipsec import crl as crl_mod
from ipsec_puppet_vault_hooks._ipsec import peers as peers_mod
from ipsec_puppet_vault_hooks.actions.base import Action
from ipsec_puppet_vault_hooks.conf import action_ipsec as action_ipsec_conf
from ipsec_puppet_vault_hooks.exceptions import ActionError
from verifier.protocol import RevocationEvent

__all__ = ["IpsecAction"]

LOG = logging.getLogger(__name__)

_REQUIRED = ("peers_dir", "ca_cert", "ca_key", "crl_file")


class IpsecAction(Action):
    """Revokes a node's IPsec certificate and tears down its SAs."""

    name = "ipsec"

    def __init__(self, conf: cfg.ConfigOpts) -> None:
        super().__init__(conf)
        action_ipsec_conf.register_opts(conf)

    @property
    def _opts(self) -> Any:
        return self.conf.action_ipsec

    def _fail(self, event: RevocationEvent, detail: str) -> ActionError:
        return ActionError(self.name, event.id, detail)

    def _handle(self, event: RevocationEvent) -> None:
        opts = self._opts
        missing = [f"[action_ipsec] {o}" for o in _REQUIRED if not opts[o]]
        if missing:
            raise self._fail(event, "not configured: " + ", ".join(missing))
        try:
            peer = peers_mod.load_peer(opts.peers_dir, event.node_uuid)
        except peers_mod.PeerError as exc:
            raise self._fail(event, str(exc)) from exc
        if peer is None:
            LOG.warning(
                "Node %s has no IPsec peer mapping in %s: nothing to revoke",
                event.node_uuid,
                opts.peers_dir,
            )
            return
        try:
            issuer = crl_mod.CrlIssuer.from_files(
                opts.ca_cert, opts.ca_key, datetime.timedelta(days=opts.crl_lifetime)
            )
            crl_pem, changed = issuer.revoke(opts.crl_file, peer.serial)
        except crl_mod.CrlError as exc:
            raise self._fail(event, str(exc)) from exc
        if changed:
            LOG.warning(
                "Added serial %x of node %s to the CRL %s",
                peer.serial,
                peer.node_uuid,
                opts.crl_file,
            )
        with self._session(event) as session:
            self._apply(session, event, peer, crl_pem)
        if opts.swanctl_conf:
            self._regenerate(event)

    @contextlib.contextmanager
    def _session(self, event: RevocationEvent) -> Iterator[vici.Session]:
        path = self._opts.vici_socket
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self._opts.vici_timeout)
            try:
                sock.connect(path)
            except OSError as exc:
                raise self._fail(
                    event, f"cannot reach charon at {path}: {exc.strerror or exc}"
                ) from exc
            yield vici.Session(sock)
        finally:
            sock.close()

    def _apply(
        self,
        session: vici.Session,
        event: RevocationEvent,
        peer: peers_mod.Peer,
        crl: bytes,
    ) -> None:
        session.load_cert({"type": "x509crl", "flag": "none", "data": crl})
        session.flush_certs({"type": "x509crl"})
        loaded = {_text(n) for n in session.get_conns().get("conns", [])}
        if peer.connection in loaded:
            session.unload_conn({"name": peer.connection})
            LOG.warning("Unloaded IPsec connection %s", peer.connection)
        ike_ids = [
            _text(sa["uniqueid"])
            for entry in session.list_sas({"ike": peer.connection})
            for sa in entry.values()
        ]
        errors = []
        for ike_id in ike_ids:
            request = {
                "ike-id": ike_id,
                "force": "yes",
                "timeout": str(self._opts.terminate_timeout),
            }
            try:
                for _log in session.terminate(request):
                    pass
            except vici.exception.CommandException as exc:
                # A peer that never answers the DELETE makes charon report
                # a failure after the timeout, yet the forced SA is gone:
                # what counts is whether any SA is left, checked below.
                errors.append(f"IKE SA {ike_id}: {exc}")
                LOG.warning(
                    "IKE SA %s of %s: no answer to DELETE, dropped (%s)",
                    ike_id,
                    peer.connection,
                    exc,
                )
            else:
                LOG.warning("Terminated IKE SA %s of %s", ike_id, peer.connection)
        left = [
            sa
            for entry in session.list_sas({"ike": peer.connection})
            for sa in entry.values()
        ]
        if left:
            raise self._fail(
                event,
                f"{len(left)} IKE SA(s) of {peer.connection} left after "
                f"terminate: {'; '.join(errors) or 'no error reported'}",
            )

    def _regenerate(self, event: RevocationEvent) -> None:
        opts = self._opts
        try:
            crl = crl_mod.load_crl(opts.crl_file)
            revoked = {r.serial_number for r in crl} if crl is not None else set()
            remaining = [
                (p.connection, p.swanctl)
                for p in peers_mod.load_peers(opts.peers_dir)
                if p.swanctl is not None and p.serial not in revoked
            ]
            text = peers_mod.render_swanctl(remaining)
        except (crl_mod.CrlError, peers_mod.PeerError) as exc:
            raise self._fail(event, str(exc)) from exc
        _write_text(opts.swanctl_conf, text)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _write_text(path: str, text: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".swanctl-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
