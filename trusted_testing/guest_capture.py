"""What one read of the measured guest returns, and how it is stored as
test fixtures (``trusted_testing/fixtures/guest``)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from dataclasses import dataclass, field

from verifier.protocol.mb import MeasuredBootPolicy
from verifier.protocol.mb.eventlog import Event
from verifier.protocol.mb.policy import policy_from_log

_QUOTE_FIELDS = ("ak_public", "nonce", "attest", "signature")


@dataclass
class Capture:
    """One consistent read of the guest's logs and PCRs.

    Attributes:
        bios_log: ``binary_bios_measurements`` (TCG crypto-agile event log).
        ima_ascii: ``ascii_runtime_measurements``.
        ima_binary: ``binary_runtime_measurements``.
        pcrs: Bank name (``sha1``, ``sha256``) to PCR index (0-10) to value.
        ak_public: The attestation key's TPM2B_PUBLIC (empty: no quote).
        nonce: The quote's qualifying data.
        attest: The quote's TPMS_ATTEST (sha256 bank, PCRs 0-10).
        signature: The quote's TPMT_SIGNATURE.
    """

    bios_log: bytes
    ima_ascii: bytes
    ima_binary: bytes
    pcrs: dict[str, dict[int, bytes]] = field(default_factory=dict)
    ak_public: bytes = b""
    nonce: bytes = b""
    attest: bytes = b""
    signature: bytes = b""

    def save(self, directory: str) -> None:
        """Write the capture as files (the fixture layout) into ``directory``."""
        os.makedirs(directory, exist_ok=True)
        for name, data in (
            ("binary_bios_measurements", self.bios_log),
            ("ascii_runtime_measurements", self.ima_ascii),
            ("binary_runtime_measurements", self.ima_binary),
        ):
            with open(os.path.join(directory, name), "wb") as handle:
                handle.write(data)
        pcrs = {
            bank: {str(i): v.hex() for i, v in sorted(values.items())}
            for bank, values in self.pcrs.items()
        }
        with open(
            os.path.join(directory, "pcrs.json"), "w", encoding="ascii"
        ) as handle:
            json.dump(pcrs, handle, indent=1, sort_keys=True)
            handle.write("\n")
        if self.attest:
            quote = {
                name: base64.b64encode(getattr(self, name)).decode()
                for name in _QUOTE_FIELDS
            }
            path = os.path.join(directory, "quote.json")
            with open(path, "w", encoding="ascii") as handle:
                json.dump(quote, handle, indent=1, sort_keys=True)
                handle.write("\n")

    @classmethod
    def load(cls, directory: str) -> Capture:
        """Read a capture written by :meth:`save`."""

        def read(name: str) -> bytes:
            with open(os.path.join(directory, name), "rb") as handle:
                return handle.read()

        with open(os.path.join(directory, "pcrs.json"), encoding="ascii") as handle:
            raw = json.load(handle)
        pcrs = {
            bank: {int(i): bytes.fromhex(v) for i, v in values.items()}
            for bank, values in raw.items()
        }
        quote: dict[str, bytes] = {}
        if os.path.exists(os.path.join(directory, "quote.json")):
            with open(os.path.join(directory, "quote.json"), encoding="ascii") as f:
                quote = {k: base64.b64decode(v) for k, v in json.load(f).items()}
        return cls(
            bios_log=read("binary_bios_measurements"),
            ima_ascii=read("ascii_runtime_measurements"),
            ima_binary=read("binary_runtime_measurements"),
            pcrs=pcrs,
            **{name: quote.get(name, b"") for name in _QUOTE_FIELDS},
        )


def measured_boot_reference(
    events: tuple[Event, ...] | list[Event],
) -> MeasuredBootPolicy:
    """A measured-boot policy that pins what a known-good boot measured:
    the product's own :func:`verifier.protocol.mb.policy.policy_from_log`
    (``trusted-tenant policy generate measured-boot --event-log``)."""
    return policy_from_log(events)


def package_version(name: str) -> str:
    """The installed version of a Debian package (what produced a fixture),
    or ``unknown``."""
    done = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", name],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or "unknown"
