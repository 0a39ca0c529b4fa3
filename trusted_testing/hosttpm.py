"""An emulated compute host for trusted compute pools (issue 29): its
platform TPM, its kernel's IMA list and its swtpm local CA.

* :class:`VendorCa`: a test TPM vendor's EK CA (made with cryptography),
  which the registrar trusts as an EK CA (``[registrar] ek_ca_bundle``);
* :class:`EmulatedHost`: one compute host —

  - its platform TPM: an swtpm manufactured with an EK but no swtpm EK
    certificate; the vendor CA's EK certificate is written into the EK
    certificate NV index (``0x1c00002`` for the RSA EK) with platform
    authorisation, as a TPM vendor provisions it, so the agent reads it
    with the same code as on real hardware;
  - its kernel: a :class:`~trusted_testing.softkernel.SoftKernel` whose
    UEFI log and IMA list (``ima_policy=tcb``: what root runs and reads)
    measure the host's programs — the real ``qemu-system-x86_64``,
    ``libvirtd``, ``swtpm``, ``nova-compute`` and the agent's files of this
    machine — and the local CA certificate file (``issuercert.pem``) when
    ``swtpm_localca`` reads it;
  - its swtpm local CA (a real ``swtpm_localca`` directory): the vTPMs
    made here (:meth:`EmulatedHost.make_vtpm`) get EK certificates from
    it, as libvirt's ``swtpm_setup --vmid`` makes them;
  - :meth:`EmulatedHost.swap_ca` (a new CA file, measured when read) and
    :meth:`EmulatedHost.run` (an unknown program, measured when run);
  - :meth:`EmulatedHost.runtime_policy` / :meth:`mb_policy`: the operator's
    host policies that the host passes until it is tampered with.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from trusted_testing.cluster_node import soft_kernel
from trusted_testing.softkernel import SoftKernel
from trusted_testing.swtpm import Swtpm, free_port_pair
from verifier.common.errors import TpmError
from verifier.common.tpm import Tpm
from verifier.protocol.ima.generate import policy_from_files
from verifier.protocol.ima.policy import RuntimePolicy
from verifier.protocol.tpm import TpmPublic
from vtpm_manager.identity import EkIdentity
from vtpm_manager.swtpm_state import create_state, read_ek

__all__ = [
    "CA_FILE",
    "EK_CERT_INDEX",
    "EmulatedHost",
    "VendorCa",
    "host_programs",
    "write_ek_certificate",
]

#: The RSA EK certificate's NV index (TCG EK Credential Profile 2.0).
EK_CERT_INDEX = 0x01C00002
#: Where the host's swtpm local CA certificate lives (``/etc/swtpm-localca.conf``).
CA_FILE = "/var/lib/swtpm-localca/issuercert.pem"
_NV_CHUNK = 512
_PROGRAMS = ("qemu-system-x86_64", "libvirtd", "swtpm", "swtpm_setup", "nova-compute")


class VendorCa:
    """A test TPM vendor's EK CA (ECDSA P-256, a self-signed root)."""

    def __init__(self, name: str = "Test TPM Vendor EK Root CA") -> None:
        now = datetime.datetime.now(datetime.UTC)
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(self.key, hashes.SHA256())
        )

    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def ek_certificate(self, ek: TpmPublic, serial: str) -> bytes:
        """A DER EK certificate for ``ek`` (no instance in its subject: a
        platform TPM's, as a vendor makes it)."""
        now = datetime.datetime.now(datetime.UTC)
        subject = x509.Name([x509.NameAttribute(NameOID.SERIAL_NUMBER, serial)])
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.cert.subject)
            .public_key(ek.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), True)
            .sign(self.key, hashes.SHA256())
        )
        return cert.public_bytes(serialization.Encoding.DER)


def write_ek_certificate(tcti: str, der: bytes, index: int = EK_CERT_INDEX) -> None:
    """Provision ``der`` as the TPM's EK certificate (NV ``index``, platform
    authorisation, readable by the owner and by its own auth), replacing
    any certificate there.

    Raises:
        TpmError: the TPM refused.
    """
    from tpm2_pytss import (
        ESYS_TR,
        TPM2_ALG,
        TPM2B_NV_PUBLIC,
        TPMA_NV,
        TPMS_NV_PUBLIC,
        TSS2_Exception,
    )

    attrs = (
        TPMA_NV.PPWRITE
        | TPMA_NV.PPREAD
        | TPMA_NV.OWNERREAD
        | TPMA_NV.AUTHREAD
        | TPMA_NV.NO_DA
        | TPMA_NV.PLATFORMCREATE
    )
    with Tpm(tcti) as tpm:
        ctx = tpm.ctx
        try:
            if index in _nv_indices(ctx):
                handle = ctx.tr_from_tpmpublic(index)
                ctx.nv_undefine_space(handle, ESYS_TR.PLATFORM)
            public = TPM2B_NV_PUBLIC(
                nvPublic=TPMS_NV_PUBLIC(
                    nvIndex=index,
                    nameAlg=TPM2_ALG.SHA256,
                    attributes=attrs,
                    dataSize=len(der),
                )
            )
            handle = ctx.nv_define_space(None, public, ESYS_TR.PLATFORM)
            for offset in range(0, len(der), _NV_CHUNK):
                chunk = der[offset : offset + _NV_CHUNK]
                ctx.nv_write(handle, chunk, offset, ESYS_TR.PLATFORM)
        except TSS2_Exception as exc:
            raise TpmError(f"provisioning the EK certificate failed: {exc}") from exc


def _nv_indices(ctx: object) -> set[int]:
    from tpm2_pytss import TPM2_CAP, TPM2_HC

    more, data = ctx.get_capability(  # type: ignore[attr-defined]
        TPM2_CAP.HANDLES, TPM2_HC.NV_INDEX_FIRST, 256
    )
    return {int(h) for h in data.data.handles}


def host_programs() -> list[tuple[str, bytes]]:
    """The host's programs as ``ima_policy=tcb`` measures them when they
    run: this machine's real qemu, libvirtd, swtpm, nova-compute (those
    installed) and the agent's files, as (path, content)."""
    found: list[tuple[str, bytes]] = []
    bindir = os.path.dirname(sys.executable)
    for name in _PROGRAMS:
        path = shutil.which(name) or shutil.which(name, path=bindir)
        if path is not None:
            found.append((os.path.realpath(path), _read(path)))
    agent = shutil.which("trusted-agent", path=bindir)
    if agent is not None:
        found.append((agent, _read(agent)))
    import node_agent

    package = os.path.dirname(os.path.abspath(node_agent.__file__))
    for name in sorted(os.listdir(package)):
        if name.endswith(".py"):
            path = os.path.join(package, name)
            found.append((path, _read(path)))
    return found


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


class EmulatedHost:
    """One emulated compute host (see the module doc).

    Args:
        directory: where its TPM state, logs and local CA live.
        name: its hypervisor host name (Nova's ``[DEFAULT]/host``).
        vendor: the vendor CA that certifies its platform TPM's EK.
        localca: the host's swtpm local CA directory (default: its own
            under ``directory``); give the one libvirt's ``swtpm_setup``
            uses on an emulated Nova compute host, and call
            :meth:`read_ca` whenever it makes a vTPM there.
    """

    def __init__(
        self,
        directory: str,
        name: str,
        vendor: VendorCa,
        localca: str | None = None,
    ) -> None:
        self.dir = os.path.abspath(directory)
        self.name = name
        self.vendor = vendor
        self.localca = os.path.abspath(
            localca or os.path.join(self.dir, "swtpm-localca")
        )
        self.tpm = Swtpm(os.path.join(self.dir, "tpm"), free_port_pair(), self.localca)
        self.kernel: SoftKernel | None = None
        self._vtpms = 0

    @property
    def tcti(self) -> str:
        return self.tpm.tcti

    @property
    def ca_file(self) -> str:
        """The local CA certificate file (``issuercert`` of its config)."""
        return os.path.join(self.localca, "issuercert.pem")

    # -- life ---------------------------------------------------------------

    def start(self) -> None:
        """Manufacture (EK, no swtpm EK certificate) and start the platform
        TPM, provision the vendor's EK certificate, boot the kernel and run
        the host's programs; the local CA is made at the first vTPM.

        Raises:
            TpmError: swtpm or the provisioning failed.
        """
        os.makedirs(self.dir, exist_ok=True)
        self._manufacture()
        self.tpm.start()
        with Tpm(self.tcti) as tpm:
            ek = TpmPublic.from_bytes(tpm.ek_public())
        write_ek_certificate(self.tcti, self.vendor.ek_certificate(ek, self.name))
        self.kernel = soft_kernel(self.tcti, self.dir)
        self.kernel.boot()
        for path, content in host_programs():
            self.kernel.measure(path, content)

    def _manufacture(self) -> None:
        if self.tpm.has_state():
            return
        os.makedirs(self.tpm.state_dir, exist_ok=True)
        cmd = ["swtpm_setup", "--tpm2", "--tpmstate", self.tpm.state_dir]
        cmd += ["--createek", "--overwrite"]
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=120, check=False
        )
        if done.returncode != 0:
            raise TpmError(f"swtpm_setup failed: {done.stdout[-800:]}{done.stderr}")

    def stop(self) -> None:
        self.tpm.stop()

    # -- what happens on the host -------------------------------------------

    def make_vtpm(self, uuid: str) -> EkIdentity:
        """A vTPM for instance ``uuid`` as libvirt makes it here
        (``swtpm_setup --vmid instance-N:<uuid>`` through the host's
        ``swtpm_localca``, which reads its CA file: measured), its EK and
        EK certificate read back as the guest agent reads them."""
        self._vtpms += 1
        path = os.path.join(self.dir, "vtpms", uuid, "tpm2")
        create_state(path, self.localca, f"instance-{self._vtpms:08x}:{uuid}")
        self.read_ca()
        return read_ek(path)

    def read_ca(self) -> None:
        """``swtpm_localca`` reads the CA certificate file: the kernel
        measures it (under its configured path, :data:`CA_FILE`)."""
        assert self.kernel is not None, "start the host first"
        self.kernel.measure(CA_FILE, _read(self.ca_file))

    def ca_pem(self) -> bytes:
        """The CA file's bytes (what ``enrol-host --ca-file`` would send is
        this, what plain ``enrol-host`` sends starts with it)."""
        return _read(self.ca_file)

    def swap_ca(self, new_ca_pem: bytes) -> None:
        """An attacker replaces the local CA certificate file; the next
        read of it (here, at once) measures the new one."""
        with open(self.ca_file, "wb") as f:
            f.write(new_ca_pem)
        self.read_ca()

    def run(self, path: str, content: bytes | None = None) -> None:
        """An unknown program runs on the host: the kernel measures it."""
        assert self.kernel is not None, "start the host first"
        self.kernel.measure(path, content or f"unknown program {path}".encode())

    # -- the operator's host policies ---------------------------------------

    def runtime_policy(
        self, name: str = "compute-host", version: int = 1
    ) -> RuntimePolicy:
        """The host IMA runtime policy: its programs, and the CA file pinned
        to the digest of the CA in place now (make a vTPM first)."""
        files: Iterable[tuple[str, bytes]] = host_programs()
        files = [*files, (CA_FILE, self.ca_pem())]
        return policy_from_files(files, name, version)

    @staticmethod
    def mb_policy() -> dict[str, object]:
        """The host measured-boot policy (the soft firmware's golden boot)."""
        return SoftKernel.golden_mb_policy()

    def write_policies(self, directory: str | None = None) -> tuple[str, str]:
        """Write the host's runtime and measured-boot policies as JSON files
        (for ``openstack attestation host enrol --runtime-policy FILE
        --mb-policy FILE`` or a policy upload); return their paths. The
        runtime policy is named ``<host name>-runtime``: one per host."""
        directory = directory or self.dir
        os.makedirs(directory, exist_ok=True)
        runtime = os.path.join(directory, f"{self.name}-runtime-policy.json")
        mb = os.path.join(directory, f"{self.name}-mb-policy.json")
        for path, document in (
            (runtime, self.runtime_policy(f"{self.name}-runtime").to_dict()),
            (mb, self.mb_policy()),
        ):
            with open(path, "w", encoding="utf-8") as f:
                json.dump(document, f, indent=1, sort_keys=True)
        return runtime, mb

    def proven_ca_sha256(self) -> str:
        """The sha256 the host's IMA list shows for the CA file (what the
        verifier reports as the proven CA digest)."""
        assert self.kernel is not None
        found = [e for e in self.kernel.entries if e.path == CA_FILE]
        if not found:
            raise LookupError(f"{self.name}: no {CA_FILE} in the IMA list")
        return found[-1].digest.hex()
