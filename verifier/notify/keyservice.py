"""The ``keyservice`` notifier: posts each signed revocation event to the
key service, which bumps the node's capability epoch, rekeys its groups and
rotates its filegroups (one message revokes everything the node holds)."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ed25519
from oslo_config import cfg

from verifier.common import tls as tlsutil
from verifier.common.errors import TransportError
from verifier.common.http import BlockingClient
from verifier.conf import keyservice as keyservice_conf
from verifier.notify.base import Notifier, NotifierError

__all__ = ["KeyServiceNotifier"]

_MAX_ANSWER = 65536


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
        self._url = url.rstrip("/") + "/v1/revocations"
        group = conf.verifier
        ctx = tlsutil.client_context(group.cert_file, group.key_file, group.ca_file)
        self._http = BlockingClient(ctx, timeout=10.0, max_answer=_MAX_ANSWER)

    def _deliver(self, event: Mapping[str, Any]) -> bool:
        try:
            answer = self._http.request(
                "POST", self._url, json=dict(event), expect_json=False
            )
        except TransportError as exc:
            raise NotifierError(f"keyservice: {exc}") from exc
        if answer.status != 200:
            raise NotifierError(
                f"keyservice: HTTP {answer.status}: {answer.error.message}"
            )
        return True
