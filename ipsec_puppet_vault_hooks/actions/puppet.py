"""The ``puppet`` action: cut a revoked node off from Puppet.

1. Revoke the node's certificate through puppetserver's CA API
   (``PUT /puppet-ca/v1/certificate_status/<certname>`` with
   ``{"desired_state": "revoked"}``), so its next agent run fails the TLS
   client check. A certificate request still pending is deleted instead
   (there is nothing to revoke yet, and it must never be signed).
2. When ``[action_puppet] puppetdb_url`` is set, deactivate the node in
   PuppetDB (the ``deactivate node`` command, version 3), so its exported
   resources stop reaching other nodes.

Both steps are idempotent: the certificate's state is read first and an
already revoked certificate (or none at all) is left as it is; the PuppetDB
command carries the event's own timestamp, so a repeat changes nothing.
"""

from __future__ import annotations

import ssl
import urllib.parse
from typing import Any

from oslo_config import cfg
from oslo_log import log as logging

from ipsec_puppet_vault_hooks import _https
from ipsec_puppet_vault_hooks._certname import CertnameTemplate
from ipsec_puppet_vault_hooks.actions.base import Action
from ipsec_puppet_vault_hooks.conf import action_puppet as action_puppet_conf
from ipsec_puppet_vault_hooks.exceptions import ActionError
from verifier.protocol import RevocationEvent

__all__ = ["PuppetAction"]

LOG = logging.getLogger(__name__)

_STATUS_PATH = "/puppet-ca/v1/certificate_status/"
_PUPPETDB_COMMAND_PATH = "/pdb/cmd/v1"


class PuppetAction(Action):
    """Revokes the node's Puppet certificate; deactivates it in PuppetDB.

    Raises (from :meth:`handle`):
        ActionError: puppetserver or PuppetDB unreachable or refusing (the
            consumer retries), or the action is misconfigured.
    """

    name = "puppet"

    def __init__(self, conf: cfg.ConfigOpts) -> None:
        super().__init__(conf)
        action_puppet_conf.register_opts(conf)
        self._context: ssl.SSLContext | None = None

    @property
    def _opts(self) -> Any:
        return self.conf.action_puppet

    def _tls(self, event: RevocationEvent) -> ssl.SSLContext:
        if self._context is None:
            o = self._opts
            if not (o.server_url and o.cert_file and o.key_file and o.ca_file):
                raise ActionError(
                    self.name,
                    event.id,
                    "[action_puppet] server_url, cert_file, key_file and "
                    "ca_file must be set",
                )
            self._context = _https.client_context(o.cert_file, o.key_file, o.ca_file)
        return self._context

    def _handle(self, event: RevocationEvent) -> None:
        try:
            certname = CertnameTemplate(self._opts.certname_template).certname(
                event.node_uuid
            )
        except ValueError as exc:
            raise ActionError(self.name, event.id, str(exc)) from exc
        context = self._tls(event)
        self._revoke(event, certname, context)
        if self._opts.puppetdb_url:
            self._deactivate(event, certname, context)

    # -- puppetserver CA -------------------------------------------------------

    def _call(
        self,
        event: RevocationEvent,
        method: str,
        url: str,
        context: ssl.SSLContext,
        body: object = None,
    ) -> _https.HttpResponse:
        try:
            resp = _https.request(
                method, url, context, body=body, timeout=self._opts.timeout
            )
        except _https.TransportError as exc:
            raise ActionError(self.name, event.id, str(exc)) from exc
        if resp.status in (401, 403):
            raise ActionError(
                self.name,
                event.id,
                f"{method} {url} refused ({resp.status}): is our client "
                f"certificate allowed by a rule in auth.conf? {resp.text()}",
            )
        return resp

    def _state(
        self, event: RevocationEvent, url: str, context: ssl.SSLContext
    ) -> str | None:
        """The certificate's state (``requested``, ``signed``, ``revoked``),
        or None when the CA knows no certificate or request for it."""
        resp = self._call(event, "GET", url, context)
        if resp.status == 404:
            return None
        data = resp.json()
        if resp.status != 200 or not isinstance(data, dict):
            raise ActionError(
                self.name,
                event.id,
                f"GET {url}: unexpected answer {resp.status}: {resp.text()}",
            )
        return str(data.get("state"))

    def _revoke(
        self, event: RevocationEvent, certname: str, context: ssl.SSLContext
    ) -> None:
        url = (
            self._opts.server_url.rstrip("/")
            + _STATUS_PATH
            + urllib.parse.quote(certname, safe="")
        )
        state = self._state(event, url, context)
        if state is None:
            LOG.info("Puppet CA has no certificate for %s: nothing to revoke", certname)
            return
        if state == "revoked":
            LOG.info("Puppet certificate of %s is already revoked", certname)
            return
        if state == "requested":
            resp = self._call(event, "DELETE", url, context)
            verb = "deleted the pending certificate request of"
        else:
            resp = self._call(
                event, "PUT", url, context, body={"desired_state": "revoked"}
            )
            verb = "revoked the Puppet certificate of"
        if resp.status not in (200, 204):
            # A concurrent revocation (another consumer) is fine too.
            if self._state(event, url, context) in (None, "revoked"):
                return
            raise ActionError(
                self.name,
                event.id,
                f"puppetserver answered {resp.status} for {certname}: {resp.text()}",
            )
        LOG.warning("Node %s: %s %s", event.node_uuid, verb, certname)

    # -- PuppetDB ---------------------------------------------------------------

    def _deactivate(
        self, event: RevocationEvent, certname: str, context: ssl.SSLContext
    ) -> None:
        query = urllib.parse.urlencode(
            {"command": "deactivate node", "version": 3, "certname": certname}
        )
        url = self._opts.puppetdb_url.rstrip("/") + _PUPPETDB_COMMAND_PATH + "?" + query
        body = {"certname": certname, "producer_timestamp": event.created_at}
        resp = self._call(event, "POST", url, context, body=body)
        if resp.status != 200:
            raise ActionError(
                self.name,
                event.id,
                f"PuppetDB answered {resp.status} to deactivate {certname}: "
                f"{resp.text()}",
            )
        LOG.warning("Node %s: deactivated %s in PuppetDB", event.node_uuid, certname)
