"""The ``keyservice`` notifier: posts each signed revocation event to the
key service, which bumps the node's capability epoch, rekeys its groups and
rotates its filegroups (one message revokes everything the node holds)."""

from __future__ import annotations

import http.client
import json
import urllib.parse
from collections.abc import Mapping
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ed25519
from oslo_config import cfg

from verifier.common import tls as tlsutil
from verifier.conf import keyservice as keyservice_conf
from verifier.notify.base import Notifier, NotifierError

__all__ = ["KeyServiceNotifier"]


class KeyServiceNotifier(Notifier):
    """POSTs the signed event to ``[capabilities] keyservice_url`` over mTLS
    with the verifier's own certificate (``[verifier] cert_file``)."""

    name = "keyservice"

    def __init__(self, conf: cfg.ConfigOpts, public_key: ed25519.Ed25519PublicKey):
        super().__init__(conf, public_key)
        keyservice_conf.register_opts(conf)
        url = conf.capabilities.keyservice_url
        if not url:
            raise NotifierError("keyservice: [capabilities] keyservice_url is not set")
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "https" or not parts.hostname:
            raise NotifierError(f"keyservice: {url!r} is not an https URL")
        self._host = parts.hostname
        self._port = parts.port or 443
        self._path = parts.path.rstrip("/") + "/v1/revocations"
        group = conf.verifier
        self._ctx = tlsutil.client_context(
            group.cert_file, group.key_file, group.ca_file
        )

    def _deliver(self, event: Mapping[str, Any]) -> bool:
        conn = http.client.HTTPSConnection(
            self._host, self._port, context=self._ctx, timeout=10
        )
        try:
            conn.request(
                "POST",
                self._path,
                body=json.dumps(dict(event)),
                headers={"Content-Type": "application/json"},
            )
            response = conn.getresponse()
            body = response.read(4096)
        finally:
            conn.close()
        if response.status != 200:
            raise NotifierError(
                f"keyservice: HTTP {response.status}: {body.decode(errors='replace')}"
            )
        return True
