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

from ipsec_puppet_vault_hooks._certname import CertnameTemplate
from ipsec_puppet_vault_hooks.actions.base import Action
from ipsec_puppet_vault_hooks.conf import action_puppet as action_puppet_conf
from ipsec_puppet_vault_hooks.exceptions import ActionError
from verifier.common import tls as tlsutil
from verifier.common.errors import TransportError
from verifier.common.http import Answer, BlockingClient
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
        self._http: BlockingClient | None = None

    @property
    def _opts(self) -> Any:
        return self.conf.action_puppet

    def _client(self, event: RevocationEvent) -> BlockingClient:
        if self._http is None:
            o = self._opts
            if not (o.server_url and o.cert_file and o.key_file and o.ca_file):
                raise ActionError(
                    self.name,
                    event.id,
                    "[action_puppet] server_url, cert_file, key_file and "
                    "ca_file must be set",
                )
            try:
                ctx = tlsutil.client_context(o.cert_file, o.key_file, o.ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise ActionError(self.name, event.id, f"TLS files: {exc}") from exc
            self._http = BlockingClient(ctx, o.timeout)
        return self._http

    def _handle(self, event: RevocationEvent) -> None:
        try:
            certname = CertnameTemplate(self._opts.certname_template).certname(
                event.node_uuid
            )
        except ValueError as exc:
            raise ActionError(self.name, event.id, str(exc)) from exc
        http = self._client(event)
        self._revoke(event, certname, http)
        if self._opts.puppetdb_url:
            self._deactivate(event, certname, http)

    # -- puppetserver CA -------------------------------------------------------

    def _call(
        self,
        event: RevocationEvent,
        method: str,
        url: str,
        http: BlockingClient,
        body: object = None,
    ) -> Answer:
        if not url.startswith("https://"):
            raise ActionError(self.name, event.id, f"refusing a non-HTTPS URL: {url}")
        try:
            resp = http.request(method, url, json=body, expect_json=method == "GET")
        except TransportError as exc:
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
        self, event: RevocationEvent, url: str, http: BlockingClient
    ) -> str | None:
        """The certificate's state (``requested``, ``signed``, ``revoked``),
        or None when the CA knows no certificate or request for it."""
        resp = self._call(event, "GET", url, http)
        if resp.status == 404:
            return None
        data = resp.data
        if resp.status != 200 or not isinstance(data, dict):
            raise ActionError(
                self.name,
                event.id,
                f"GET {url}: unexpected answer {resp.status}: {resp.text()}",
            )
        return str(data.get("state"))

    def _revoke(
        self, event: RevocationEvent, certname: str, http: BlockingClient
    ) -> None:
        url = (
            self._opts.server_url.rstrip("/")
            + _STATUS_PATH
            + urllib.parse.quote(certname, safe="")
        )
        state = self._state(event, url, http)
        if state is None:
            LOG.info("Puppet CA has no certificate for %s: nothing to revoke", certname)
            return
        if state == "revoked":
            LOG.info("Puppet certificate of %s is already revoked", certname)
            return
        if state == "requested":
            resp = self._call(event, "DELETE", url, http)
            verb = "deleted the pending certificate request of"
        else:
            resp = self._call(
                event, "PUT", url, http, body={"desired_state": "revoked"}
            )
            verb = "revoked the Puppet certificate of"
        if resp.status not in (200, 204):
            # A concurrent revocation (another consumer) is fine too.
            if self._state(event, url, http) in (None, "revoked"):
                return
            raise ActionError(
                self.name,
                event.id,
                f"puppetserver answered {resp.status} for {certname}: {resp.text()}",
            )
        LOG.warning("Node %s: %s %s", event.node_uuid, verb, certname)

    # -- PuppetDB ---------------------------------------------------------------

    def _deactivate(
        self, event: RevocationEvent, certname: str, http: BlockingClient
    ) -> None:
        query = urllib.parse.urlencode(
            {"command": "deactivate node", "version": 3, "certname": certname}
        )
        url = self._opts.puppetdb_url.rstrip("/") + _PUPPETDB_COMMAND_PATH + "?" + query
        body = {"certname": certname, "producer_timestamp": event.created_at}
        resp = self._call(event, "POST", url, http, body=body)
        if resp.status != 200:
            raise ActionError(
                self.name,
                event.id,
                f"PuppetDB answered {resp.status} to deactivate {certname}: "
                f"{resp.text()}",
            )
        LOG.warning("Node %s: deactivated %s in PuppetDB", event.node_uuid, certname)
