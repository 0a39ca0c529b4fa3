"""A synthetic event log of a UEFI Secure Boot disk boot, in the order and
format OVMF (EDK2), shim and GRUB write it, and the policy that pins it.

Until a real Secure Boot guest's log is captured, the chain policy's tests
build their logs here. What each component logs (see
:mod:`verifier.protocol.mb.chain` for the sources):

* OVMF: ``SecureBoot``, ``PK``, ``KEK``, ``db``, ``dbx`` as
  ``EV_EFI_VARIABLE_DRIVER_CONFIG`` in PCR 7 (data: ``UEFI_VARIABLE_DATA``,
  digest over all of it), separators in PCRs 0-7, the ``db`` entry that
  verified shim (``EV_EFI_VARIABLE_AUTHORITY``), shim's Authenticode digest
  in PCR 4;
* shim: ``SbatLevel`` and ``MokListTrusted`` authority events in PCR 7,
  ``MokList``/``MokListX``/``MokListTrusted`` in PCR 14 (``EV_IPL``, data
  the name, digest over the contents), its built-in certificate
  (``Shim``) as the authority of GRUB, GRUB's and the kernel's digests in
  PCR 4 (the kernel's authority is not logged again: shim logs an
  authority once);
* GRUB: its commands and the kernel command line in PCR 8, the files it
  reads (grub.cfg, kernel, initrd) in PCR 9.

Certificates are real X.509 (self-signed, made once per process).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import struct
import uuid
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from node_agent.trial.eventlog import LogWriter, efi_variable_data
from verifier.protocol.mb import efisig
from verifier.protocol.mb.eventlog import (
    EV_EFI_ACTION,
    EV_EFI_BOOT_SERVICES_APPLICATION,
    EV_EFI_PLATFORM_FIRMWARE_BLOB,
    EV_EFI_VARIABLE_AUTHORITY,
    EV_EFI_VARIABLE_DRIVER_CONFIG,
    EV_IPL,
    EV_S_CRTM_VERSION,
    EV_SEPARATOR,
)
from verifier.protocol.mb.policy import EFI_GLOBAL_VARIABLE

__all__ = [
    "SecureBootBoot",
    "cert_der",
    "cert_pem",
    "coff_image",
    "sbat_section",
    "vendor_cert_section",
]

KERNEL_PATH = "/boot/vmlinuz-6.1.0-18-amd64"
INITRD_PATH = "/boot/initrd.img-6.1.0-18-amd64"
ROOT = "UUID=6b1a3e0c-2f44-4a57-9d3e-51c0a3a2d7e1"
OWNER_MS = uuid.UUID("77fa9abd-0359-4d32-bd60-28f4e78f784b")
_KERNELS = r"/boot/vmlinuz-[0-9.]+-[0-9]+-amd64"
SBAT_LEVEL = "sbat,1,2023012900\nshim,2\ngrub,3\ngrub.debian,4\n"


@functools.cache
def _cert(name: str) -> x509.Certificate:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=3650))
        .sign(key, hashes.SHA256())
    )


def cert_der(name: str) -> bytes:
    """A self-signed certificate named ``name`` (the same within a
    process), DER."""
    return _cert(name).public_bytes(serialization.Encoding.DER)


def cert_pem(name: str) -> str:
    """:func:`cert_der` in PEM."""
    return _cert(name).public_bytes(serialization.Encoding.PEM).decode()


def _x509_key(name: str) -> str:
    return "x509:" + hashlib.sha256(cert_der(name)).hexdigest()


def _esl_certs(names: list[str]) -> bytes:
    return b"".join(
        efisig.signature_list(efisig.EFI_CERT_X509, OWNER_MS, [cert_der(n)])
        for n in names
    )


@dataclasses.dataclass
class SecureBootBoot:
    """One boot of a Debian-like image under Secure Boot; change a field to
    make the log of a different boot.

    Certificates are named (see :func:`cert_der`); images and files are
    stand-in bytes (their digests are what the log and policy carry).
    """

    secure_boot: bool = True
    pk: str = "Tenant PK"
    kek: list[str] = dataclasses.field(default_factory=lambda: ["Microsoft KEK CA"])
    db: list[str] = dataclasses.field(
        default_factory=lambda: ["Microsoft UEFI CA 2011", "Microsoft Windows PCA"]
    )
    dbx: list[bytes] = dataclasses.field(
        default_factory=lambda: [
            hashlib.sha256(b"revoked %d" % i).digest() for i in range(5)
        ]
    )
    #: the db certificate that verified shim
    shim_authority: str = "Microsoft UEFI CA 2011"
    #: shim's built-in certificate, authority of GRUB and the kernel
    vendor_cert: str = "Debian Secure Boot CA"
    sbat_level: str = SBAT_LEVEL
    moklist: bytes = b""
    shim: bytes = b"shimx64.efi 15.8-1"
    grub: bytes = b"grubx64.efi 2.12-1"
    kernel: bytes = b"vmlinuz 6.1.0-18 signed"
    cmdline: str = f"root={ROOT} ro quiet"
    initrd: bytes = b"initrd.img 6.1.0-18"
    banks: tuple[str, ...] = ("sha1", "sha256")

    def digest(self, image: bytes) -> bytes:
        """The stand-in Authenticode digest of an image."""
        return hashlib.sha256(b"authenticode:" + image).digest()

    def moklist_contents(self) -> bytes:
        """What shim logs for MokList: its certificate, then the MOKs."""
        vendor = efisig.signature_list(
            efisig.EFI_CERT_X509, efisig.SHIM_LOCK, [cert_der(self.vendor_cert)]
        )
        return vendor + self.moklist

    def kernel_cmdline(self) -> str:
        return f"BOOT_IMAGE={KERNEL_PATH} {self.cmdline}"

    def build(self) -> bytes:
        """The log bytes."""
        log = LogWriter(self.banks)
        self._firmware(log)
        self._shim(log)
        self._grub(log)
        app = b"\0" * 32  # EFI_IMAGE_LOAD_EVENT as shim writes it
        log.add(
            4, EV_EFI_BOOT_SERVICES_APPLICATION, app, digests=self._app(self.kernel)
        )
        log.add(5, EV_EFI_ACTION, b"Exit Boot Services Invocation")
        return log.build()

    def _app(self, image: bytes) -> dict[str, bytes]:
        sha256 = self.digest(image)
        return {
            b: sha256 if b == "sha256" else hashlib.new(b, sha256).digest()
            for b in self.banks
        }

    def _firmware(self, log: LogWriter) -> None:
        log.add(0, EV_S_CRTM_VERSION, "1.0".encode("utf-16-le") + b"\0\0")
        log.add(0, EV_EFI_PLATFORM_FIRMWARE_BLOB, bytes(16), measured=b"OVMF PEI FV")
        db_guid = efisig.EFI_IMAGE_SECURITY_DATABASE
        variables = [
            (
                EFI_GLOBAL_VARIABLE,
                "SecureBoot",
                b"\x01" if self.secure_boot else b"\x00",
            ),
            (EFI_GLOBAL_VARIABLE, "PK", _esl_certs([self.pk])),
            (EFI_GLOBAL_VARIABLE, "KEK", _esl_certs(self.kek)),
            (db_guid, "db", _esl_certs(self.db)),
            (
                db_guid,
                "dbx",
                efisig.signature_list(efisig.EFI_CERT_SHA256, OWNER_MS, self.dbx),
            ),
        ]
        for guid, name, data in variables:
            log.add(
                7, EV_EFI_VARIABLE_DRIVER_CONFIG, efi_variable_data(guid, name, data)
            )
        log.add(4, EV_EFI_ACTION, b"Calling EFI Application from Boot Option")
        for pcr in range(8):
            log.add(pcr, EV_SEPARATOR, b"\0\0\0\0")
        if self.secure_boot:
            entry = OWNER_MS.bytes_le + cert_der(self.shim_authority)
            log.add(
                7, EV_EFI_VARIABLE_AUTHORITY, efi_variable_data(db_guid, "db", entry)
            )
        app = b"\0" * 32
        log.add(4, EV_EFI_BOOT_SERVICES_APPLICATION, app, digests=self._app(self.shim))

    def _shim(self, log: LogWriter) -> None:
        lock = efisig.SHIM_LOCK
        sbat = self.sbat_level.encode()
        log.add(
            7, EV_EFI_VARIABLE_AUTHORITY, efi_variable_data(lock, "SbatLevel", sbat)
        )
        log.add(
            7,
            EV_EFI_VARIABLE_AUTHORITY,
            efi_variable_data(lock, "MokListTrusted", b"\x01"),
        )
        log.add(14, EV_IPL, b"MokList\0", measured=self.moklist_contents())
        dummy = efisig.signature_list(efisig.EFI_CERT_SHA256, lock, [bytes(32)])
        log.add(14, EV_IPL, b"MokListX\0", measured=dummy)
        log.add(14, EV_IPL, b"MokListTrusted\0", measured=b"\x01")
        if self.secure_boot:
            vendor = cert_der(self.vendor_cert)
            log.add(
                7, EV_EFI_VARIABLE_AUTHORITY, efi_variable_data(lock, "Shim", vendor)
            )
        app = b"\0" * 32
        log.add(4, EV_EFI_BOOT_SERVICES_APPLICATION, app, digests=self._app(self.grub))

    def _grub(self, log: LogWriter) -> None:
        def cmd(kind: str, text: str) -> None:
            log.add(
                8, EV_IPL, f"{kind}: {text}".encode() + b"\0", measured=text.encode()
            )

        def read(path: str, contents: bytes) -> None:
            log.add(9, EV_IPL, path.encode() + b"\0", measured=contents)

        read(
            "(hd0,gpt15)/EFI/debian/grub.cfg",
            b"search.fs_uuid ... root\nconfigfile $prefix/grub.cfg\n",
        )
        cmd("grub_cmd", "search.fs_uuid 6b1a3e0c root")
        cmd("grub_cmd", "configfile ($root)/boot/grub/grub.cfg")
        read("(hd0,gpt1)/boot/grub/grub.cfg", b"menuentry 'Debian GNU/Linux' { ... }\n")
        cmd("grub_cmd", "insmod ext2")
        cmd("grub_cmd", f"linux {KERNEL_PATH} {self.cmdline}")
        read(KERNEL_PATH, self.kernel)
        cmd("kernel_cmdline", self.kernel_cmdline())
        cmd("grub_cmd", f"initrd {INITRD_PATH}")
        read(INITRD_PATH, self.initrd)
        cmd("grub_cmd", "boot")

    def policy(self) -> dict[str, Any]:
        """The measured-boot policy this boot passes, pinning every part of
        the chain."""
        return {
            "secure_boot": True,
            "pk": [cert_pem(self.pk)],
            "kek": [_x509_key(n) for n in self.kek],
            "db": [_x509_key(n) for n in self.db],
            "dbx": ["sha256:" + h.hex() for h in self.dbx],
            "authorities": [
                {"variable": "db", "entry": _x509_key(self.shim_authority)},
                {"variable": "Shim", "entry": _x509_key(self.vendor_cert)},
            ],
            "sbat_level": self.sbat_level,
            "mok": {
                "MokList": [hashlib.sha256(self.moklist_contents()).hexdigest()],
                "MokListX": ["empty"],
                "MokListTrusted": [hashlib.sha256(b"\x01").hexdigest()],
            },
            "shim": [self.digest(self.shim).hex()],
            "grub": [self.digest(self.grub).hex()],
            "kernels": [self.digest(self.kernel).hex()],
            "kernel_cmdlines": [
                {"pattern": rf"BOOT_IMAGE={_KERNELS} root={ROOT} ro( quiet)?"}
            ],
            "initrds": [hashlib.sha256(self.initrd).hexdigest()],
        }


def coff_image(sections: list[tuple[bytes, bytes]]) -> bytes:
    """A PE image (no optional header) of ``(name, data)`` sections; names
    longer than eight bytes go into the string table (``/N``), as the
    linker writes them."""
    head = bytearray(0x400)
    head[:2] = b"MZ"
    struct.pack_into("<I", head, 0x3C, 0x80)
    head[0x80 : 0x80 + 4] = b"PE\0\0"
    struct.pack_into("<HH", head, 0x80 + 4, 0x8664, len(sections))
    body, strings = bytearray(), bytearray(4)
    for i, (name, data) in enumerate(sections):
        if len(name) > 8:
            field = f"/{len(strings)}".encode()
            strings += name + b"\0"
        else:
            field = name
        entry = (0x80 + 24) + 40 * i
        head[entry : entry + 8] = field.ljust(8, b"\0")
        offset = len(head) + len(body)
        struct.pack_into("<IIII", head, entry + 8, len(data), 0, len(data), offset)
        body += data
    symbols = len(head) + len(body)
    struct.pack_into("<II", head, 0x80 + 12, symbols, 0)
    struct.pack_into("<I", strings, 0, len(strings))
    return bytes(head + body + strings)


def vendor_cert_section(cert: bytes, dbx: bytes) -> bytes:
    """shim's ``.vendor_cert`` section (see verifier.protocol.mb.shim)."""
    return struct.pack("<IIII", len(cert), len(dbx), 16, 16 + len(cert)) + cert + dbx


def sbat_section(previous: str, latest: str) -> bytes:
    """shim's ``.sbatlevel`` section (see verifier.protocol.mb.shim)."""
    first = previous.encode() + b"\0"
    return struct.pack("<III", 0, 8, 8 + len(first)) + first + latest.encode() + b"\0"
