"""Fuzz targets of what crosses the wire: envelopes, signed events,
capabilities, rekey messages, typed wire messages, user-data, JSON,
CP-ABE blobs, EK anchors and the HTTP/1.1 answers the verifier's own
client reads from agents (see :mod:`trusted_testing.fuzz_targets`)."""

from __future__ import annotations

import functools
import json
import os
import uuid
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ed25519, x25519

from trusted_testing.fuzz_common import NODE, RAW, Target
from trusted_testing.fuzz_common import dump_json as _dump
from trusted_testing.fuzz_common import load_json as _json
from verifier.protocol import ShareKind, jsonlimits

__all__ = ["wire_targets"]

# -- envelopes, events, capabilities, rekey messages ------------------------------


@functools.lru_cache(maxsize=1)
def _keys() -> Any:
    return os.urandom(32), x25519.X25519PrivateKey.generate()


def _envelope(data: bytes) -> object:
    from verifier.protocol import open_payload, open_share

    key, nk = _keys()
    if data[:1] == b"s":
        return open_share(nk, data[1:], ShareKind.V, NODE)
    return open_payload(key, data[1:], NODE)


def _envelope_seeds() -> list[bytes]:
    from verifier.protocol import seal_payload, seal_share

    key, nk = _keys()
    return [
        b"p" + seal_payload(key, b"payload", NODE),
        b"s"
        + seal_share(nk.public_key().public_bytes(*RAW), b"v" * 32, ShareKind.V, NODE),
    ]


@functools.lru_cache(maxsize=1)
def _event_key() -> ed25519.Ed25519PrivateKey:
    return ed25519.Ed25519PrivateKey.generate()


def _signed_event(data: bytes) -> object:
    from verifier.protocol import SignedEvent

    return SignedEvent.from_dict(_json(data)).verify(_event_key().public_key())


def _event_seeds() -> list[bytes]:
    from verifier.protocol import RevocationEvent

    event = RevocationEvent(
        str(uuid.UUID(int=1)), NODE, "pcr_policy", "PCR 16", "2026-01-01T00:00:00Z"
    )
    return [_dump(event.sign(_event_key()).to_dict())]


def _capability(data: bytes) -> object:
    from verifier.protocol.capability import CapabilityChecker

    checker = CapabilityChecker(_keys()[0])
    return checker.check_token(data.decode("utf-8", "replace"), "secret:s", "r", 1.0)


def _capability_seeds() -> list[bytes]:
    from verifier.protocol.capability import NONCE_BYTES, issue

    cap = issue(_keys()[0], NODE, "secret:s", "r", 60, 0, bytes(NONCE_BYTES))
    return [cap.to_token().encode()]


def _rekey(data: bytes) -> object:
    from verifier.protocol.lkh import RekeyMessage, Welcome

    if data[:1] == b"w":
        return Welcome.from_dict(_json(data[1:]))
    return RekeyMessage.from_bytes(data[1:])


def _rekey_seeds() -> list[bytes]:
    from verifier.protocol.lkh import LkhTree

    tree = LkhTree("fuzz", _event_key(), degree=2)
    _, welcome = tree.join("a")
    message, _ = tree.join("b")
    return [b"w" + _dump(welcome.to_dict()), b"r" + message.to_bytes()]


# -- wire messages -----------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _message_classes() -> list[Any]:
    from verifier.protocol.deepquote import DeepQuote
    from verifier.protocol.merkle import Header
    from verifier.protocol.messages import (
        abe,
        capabilities,
        enrolment,
        host_trust,
        keyservice,
        monitor,
        policies,
        provider,
        registration,
        shares,
    )
    from verifier.protocol.messages import errors as error_body
    from verifier.protocol.messages import quote as quote_messages
    from verifier.protocol.monitor import MonitorAttestation

    modules = (
        abe,
        capabilities,
        enrolment,
        host_trust,
        keyservice,
        monitor,
        policies,
        provider,
        registration,
        shares,
        error_body,
        quote_messages,
    )
    found = [DeepQuote, Header, MonitorAttestation]
    for module in modules:
        for name in sorted(vars(module)):
            value = getattr(module, name)
            if (
                isinstance(value, type)
                and value.__module__ == module.__name__
                and callable(getattr(value, "from_dict", None))
            ):
                found.append(value)
    return found


def _wire_message(data: bytes) -> object:
    """The first byte picks the message class, the rest is its JSON."""
    classes = _message_classes()
    if not data:
        return None
    cls = classes[data[0] % len(classes)]
    return cls.from_dict(_json(data[1:]))


def _message_seeds() -> list[bytes]:
    classes = _message_classes()
    return [bytes([i]) + b'{"a": 1}' for i in range(len(classes))]


def _user_data(data: bytes) -> object:
    """The agent's reading of cloud-init's files: user-data (MIME, maybe
    gzip) or, with a leading ``b``, the bootstrap file."""
    from verifier.protocol.userdata import BootstrapConfig, parse_user_data

    if data[:1] == b"b":
        return BootstrapConfig.from_json(data[1:])
    return parse_user_data(data[1:])


def _user_data_seeds() -> list[bytes]:
    config = {"boot_id": NODE, "registrar_url": "https://127.0.0.1:8891"}
    cloud = "#cloud-config\n" + json.dumps(
        {
            "write_files": [
                {
                    "path": "/etc/trusted-cloud/bootstrap.json",
                    "content": json.dumps(config),
                }
            ]
        }
    )
    mime = (
        'Content-Type: multipart/mixed; boundary="b"\nMIME-Version: 1.0\n\n'
        "--b\nContent-Type: text/cloud-config\n\n" + cloud + "\n--b--\n"
    )
    return [b"b" + _dump(config), b"u" + mime.encode()]


def _json_text(data: bytes) -> object:
    return jsonlimits.loads(data)


def _abe_blob(data: bytes) -> object:
    from verifier.protocol.abe.bsw07 import Ciphertext, PublicParams, SecretKey

    kind, body = data[:1], data[1:]
    if kind == b"c":
        return Ciphertext.from_bytes(body)
    if kind == b"k":
        return SecretKey.from_bytes(body)
    return PublicParams.from_bytes(body)


def _abe_seeds() -> list[bytes]:
    return [b"c" + bytes(64), b"k" + bytes(64), b"p" + bytes(64)]


def _ek_anchors(data: bytes) -> object:
    from verifier.protocol.ekcert import load_anchors

    return load_anchors(data)


def _http_response(data: bytes) -> object:
    """The client's answer parser, fed ``data[1:]`` in pieces whose sizes
    follow from ``data[0]`` (answers arrive in arbitrary reads); then the
    connection closes. Only HttpFramingError may come out."""
    from verifier.common._http11 import HttpFramingError, ResponseParser

    if not data:
        return None
    step, body = 1 + data[0] % 61, data[1:]
    parser = ResponseParser(max_body=4096, head_request=data[0] >= 250)
    try:
        for start in range(0, len(body), step):
            parser.feed(body[start : start + step])
        parser.feed_eof()
    except HttpFramingError as exc:
        return exc
    return parser.result


def _http_seeds() -> list[bytes]:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    return [
        b"\x07" + head + b"Content-Length: 2\r\n\r\n{}",
        b"\x03" + head + b"Transfer-Encoding: chunked\r\n\r\n"
        b"2;x=y\r\n{}\r\n0\r\nTrailer: t\r\n\r\n",
        b"\x20HTTP/1.0 404 Not Found\r\nConnection: close\r\n\r\nno such node",
        b"\xfa" + head + b"Content-Length: 10\r\n\r\n",
        b"\x01HTTP/1.1 204 No Content\r\n\r\n",
    ]


def _http_request(data: bytes) -> object:
    """The lean server's request parser, fed ``data[1:]`` in pieces whose
    sizes follow from ``data[0]``, every complete request taken as it
    comes. Only BadRequestError may come out."""
    from verifier.common._http11_request import BadRequestError, RequestParser

    if not data:
        return None
    step, body = 1 + data[0] % 61, data[1:]
    parser = RequestParser(max_body=4096)
    requests = []
    try:
        for start in range(0, len(body), step):
            parser.feed(body[start : start + step])
            while (request := parser.next_request()) is not None:
                requests.append(request)
    except BadRequestError as exc:
        return exc
    return requests


def _http_request_seeds() -> list[bytes]:
    head = b"POST /v1/push/n/evidence HTTP/1.1\r\nHost: v:8882\r\n"
    return [
        b"\x07" + head + b"Content-Length: 2\r\n\r\n{}",
        b"\x03" + head + b"Content-Length: 0\r\n\r\n" + head + b"\r\n",
        b"\x20GET /healthcheck HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
        b"\x01" + head + b"Expect: 100-continue\r\nContent-Length: 3\r\n\r\nabc",
        b"\x05" + head + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    ]


def wire_targets() -> list[Target]:
    """The targets of this module."""
    return [
        Target("envelope", _envelope, _envelope_seeds),
        Target("signed_event", _signed_event, _event_seeds),
        Target("capability", _capability, _capability_seeds),
        Target("rekey", _rekey, _rekey_seeds),
        Target("wire_message", _wire_message, _message_seeds),
        Target("user_data", _user_data, _user_data_seeds),
        Target("json", _json_text, lambda: [b'{"a": [1, 2.5, "x", null]}']),
        Target("abe_blob", _abe_blob, _abe_seeds),
        Target("ek_anchors", _ek_anchors, lambda: [b"-----BEGIN CERTIFICATE-----\n"]),
        Target("http_response", _http_response, _http_seeds),
        Target("http_request", _http_request, _http_request_seeds),
    ]
