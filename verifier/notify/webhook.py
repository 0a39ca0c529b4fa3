"""The ``webhook`` notifier: HTTPS POST of the signed event, over mTLS.

Acknowledgement: an endpoint answers 2xx only after it verified the event
and its actions ran (or it had already processed that event id), so a 2xx
is the consumer's acknowledgement. Anything else (a refused connection, a
timeout, a 4xx or 5xx) leaves the event undelivered; the outbox tries it
again with exponential back-off (``[verifier] outbox_retry_delay``).
"""

from __future__ import annotations

import ssl
import urllib.parse
from collections.abc import Mapping
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ed25519
from oslo_config import cfg

from verifier.common import tls as tlsutil
from verifier.common.errors import TransportError
from verifier.common.http import BlockingClient
from verifier.conf import notifiers as notifiers_conf
from verifier.exceptions import ConfigError
from verifier.notify.base import Notifier, NotifierError

__all__ = ["WebhookNotifier"]

_MAX_ANSWER = 65536


class WebhookNotifier(Notifier):
    """POSTs each event to every ``[notifier_webhook] urls`` endpoint.

    Raises:
        ConfigError: without URLs, with a non-HTTPS URL, or without the
            TLS files.
    """

    name = "webhook"

    def __init__(self, conf: cfg.ConfigOpts, public_key: ed25519.Ed25519PublicKey):
        super().__init__(conf, public_key)
        notifiers_conf.register_opts(conf)
        group = conf.notifier_webhook
        if not group.urls:
            raise ConfigError("[notifier_webhook] urls is empty")
        self._urls = list(group.urls)
        for url in self._urls:
            parts = urllib.parse.urlsplit(url)
            if parts.scheme != "https" or not parts.hostname:
                raise ConfigError(
                    f"[notifier_webhook] urls: {url!r} is not an https:// URL"
                )
        cert = group.cert_file or conf.verifier.cert_file
        key = group.key_file or conf.verifier.key_file
        ca = group.ca_file or conf.verifier.ca_file
        if not (cert and key and ca):
            raise ConfigError(
                "[notifier_webhook] needs cert_file, key_file and ca_file "
                "(or the [verifier] ones)"
            )
        try:
            ctx = tlsutil.client_context(cert, key, ca)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"[notifier_webhook] TLS files: {exc}") from exc
        self._http = BlockingClient(ctx, group.timeout, max_answer=_MAX_ANSWER)

    def _deliver(self, event: Mapping[str, Any]) -> bool:
        for url in self._urls:
            self._post(url, event)
        return True

    def _post(self, url: str, event: Mapping[str, Any]) -> None:
        try:
            answer = self._http.request("POST", url, json=event, expect_json=False)
        except TransportError as exc:
            raise NotifierError(f"webhook {url}: {exc}") from exc
        if not answer.ok:
            raise NotifierError(
                f"webhook {url}: HTTP {answer.status} {answer.error.message[:200]}"
            )
