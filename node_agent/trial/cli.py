"""``trusted-trial``: a software TPM with an EK certificate, and a firmware
and kernel stand-in that write the evidence a real node's agent reads
(TRIAL MODE, see :mod:`node_agent.trial`).

Exit status: 0 on success, 2 on a usage error (one line on stderr), 1 when
swtpm or the TPM fails.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence

from node_agent.exceptions import NodeAgentError
from node_agent.trial import EVENT_LOG, IMA_LIST
from node_agent.trial.eventlog import sample_log
from node_agent.trial.ima import boot_aggregate_entry, make_entry
from verifier.common import version
from verifier.common.errors import TpmError
from verifier.protocol.ima.log import IMA_PCR, ImaEntry
from verifier.protocol.mb import parse
from verifier.protocol.mb.eventlog import EV_NO_ACTION

__all__ = ["main"]

_HOST = "127.0.0.1"
_STATE = "state"
_LOCALCA = "localca"
#: what the stand-in firmware measures as the boot loader and the kernel
#: when no file is given
BOOTLOADER = b"grubx64.efi of the trial image"
KERNEL = b"vmlinuz of the trial image"


class TrialError(NodeAgentError):
    """swtpm, the TPM or a file failed (exit status 1)."""


def _tpm(tcti: str):  # type: ignore[no-untyped-def]
    from verifier.common.tpm import Tpm  # tpm2-pytss: only when a TPM is used

    return Tpm(tcti)


def _ek_ca_bundle(localca: str) -> bytes:
    from verifier.common.swtpm_localca import ek_ca_bundle

    return ek_ca_bundle(localca)


def serve_tpm(directory: str, port: int, ek_alg: str) -> int:
    """Manufacture the TPM once (EK certificate from a local CA in
    ``directory``), write ``directory/ek-ca.pem``, then become swtpm."""
    from verifier.common.swtpm_localca import write_localca_config

    for tool in ("swtpm", "swtpm_setup", "swtpm_localca"):
        if shutil.which(tool) is None:
            raise TrialError(
                f"{tool} is not installed (Debian: apt-get install swtpm swtpm-tools)"
            )
    state = os.path.join(directory, _STATE)
    localca = os.path.join(directory, _LOCALCA)
    if not os.path.exists(os.path.join(state, "tpm2-00.permall")):
        os.makedirs(state, exist_ok=True)
        setup = [
            "swtpm_setup",
            "--tpm2",
            "--tpmstate",
            state,
            "--create-ek-cert",
            "--config",
            write_localca_config(localca),
            "--overwrite",
        ]
        if ek_alg == "ecc":
            setup.append("--ecc")
        done = subprocess.run(setup, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = (done.stdout + done.stderr).strip().splitlines()[-1:]
            raise TrialError(
                f"swtpm_setup failed ({done.returncode}): {' '.join(tail)}"
            )
    bundle = os.path.join(directory, "ek-ca.pem")
    with open(bundle, "wb") as f:
        f.write(_ek_ca_bundle(localca))
    print(f"EK CA bundle (the registrar's ek_ca_bundle): {bundle}", flush=True)
    print(f"TPM (the agent's tcti): swtpm:host={_HOST},port={port}", flush=True)
    # swtpm in this process's place: its signals and exit status are ours
    os.execvp(  # noqa: S606 - a fixed program and arguments, no shell
        "swtpm",
        [
            "swtpm",
            "socket",
            "--tpm2",
            "--server",
            f"type=tcp,port={port},bindaddr={_HOST}",
            "--ctrl",
            f"type=tcp,port={port + 1},bindaddr={_HOST}",
            "--tpmstate",
            f"dir={state}",
            "--flags",
            "not-need-init,startup-clear",
        ],
    )


def _append(path: str, entry: ImaEntry) -> None:
    """One line, one write: the agent may read the list meanwhile."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (entry.to_ascii() + "\n").encode("utf-8", "surrogateescape"))
    finally:
        os.close(fd)


def boot(directory: str, tcti: str, secure_boot: bool, kernel: bytes) -> None:
    """The firmware measures the boot chain into PCRs 0-7 and logs it; the
    kernel starts IMA with its boot aggregate (PCR 10). The TPM must be
    fresh (just started): its PCRs must hold only what this log says."""
    os.makedirs(directory, exist_ok=True)
    log = sample_log(
        secure_boot=secure_boot, bootloader=BOOTLOADER, kernel=kernel, locality=None
    )
    with _tpm(tcti) as tpm:
        before = tpm.pcr_read([*range(8), IMA_PCR])
        if any(value != bytes(32) for value in before.values()):
            raise TrialError(
                "the TPM's PCRs 0-7 or 10 are not zero: it was booted already "
                "(restart 'trusted-trial tpm' for a new boot)"
            )
        with open(os.path.join(directory, EVENT_LOG), "wb") as f:
            f.write(log)
        for event in parse(log).events:
            if event.event_type != EV_NO_ACTION:
                tpm.pcr_extend(event.pcr, event.digests["sha256"])
        values = tpm.pcr_read(range(10))
        entry = boot_aggregate_entry([values[i] for i in range(10)])
        ima = os.path.join(directory, IMA_LIST)
        open(ima, "w").close()
        _append(ima, entry)
        tpm.pcr_extend(IMA_PCR, hashlib.sha256(entry.template_data).digest())


def run(directory: str, tcti: str, files: Sequence[str]) -> list[ImaEntry]:
    """IMA measures each file before it runs: the entry first, then PCR 10
    (the kernel's order)."""
    ima = os.path.join(directory, IMA_LIST)
    if not os.path.exists(ima):
        raise TrialError(f"{ima} does not exist: run 'trusted-trial boot' first")
    entries = []
    with _tpm(tcti) as tpm:
        for name in files:
            path = os.path.abspath(name)
            with open(path, "rb") as f:
                entry = make_entry(path, f.read())
            _append(ima, entry)
            tpm.pcr_extend(IMA_PCR, hashlib.sha256(entry.template_data).digest())
            entries.append(entry)
    return entries


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trusted-trial",
        description="TRIAL MODE, never on a production node: a software TPM "
        "with an EK certificate, and a firmware and kernel stand-in that write "
        "the event log and IMA list an agent with [agent] trial_dir sends.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    tpm = sub.add_parser(
        "tpm",
        help="manufacture (once) and serve a software TPM with an EK "
        "certificate; runs in the foreground",
    )
    tpm.add_argument("--dir", required=True, help="the TPM's state and local CA")
    tpm.add_argument(
        "--port", type=int, default=2321, help="command port (control: +1)"
    )
    tpm.add_argument("--ek-alg", choices=("rsa", "ecc"), default="rsa")
    for name, text in (
        ("boot", "measure a boot (event log, PCRs 0-7) and start the IMA list"),
        ("run", "measure files as IMA does before running them (PCR 10)"),
    ):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("--dir", required=True, help="where the logs are (trial_dir)")
        cmd.add_argument(
            "--tcti", default=f"swtpm:host={_HOST},port=2321", help="the software TPM"
        )
        if name == "boot":
            cmd.add_argument("--secure-boot", choices=("on", "off"), default="on")
            cmd.add_argument(
                "--kernel", help="a file the firmware measures as the kernel"
            )
        else:
            cmd.add_argument("files", nargs="+", metavar="FILE")
    return parser


def main(argv: list[str] | None = None) -> int:
    version.exit_if_asked(argv, "trusted-trial")
    args = _parser().parse_args(argv)  # a usage error: exit 2
    try:
        if args.command == "tpm":
            return serve_tpm(args.dir, args.port, args.ek_alg)
        if args.tcti.strip().startswith("device"):
            print(
                "trusted-trial: error: --tcti must be a software TPM, not "
                f"{args.tcti!r}",
                file=sys.stderr,
            )
            return 2
        if args.command == "boot":
            kernel = KERNEL
            if args.kernel:
                with open(args.kernel, "rb") as f:
                    kernel = f.read()
            boot(args.dir, args.tcti, args.secure_boot == "on", kernel)
            print(
                f"booted: {os.path.join(args.dir, EVENT_LOG)}, "
                f"{os.path.join(args.dir, IMA_LIST)}"
            )
        else:
            for entry in run(args.dir, args.tcti, args.files):
                print(f"measured: {entry.path}")
    except (TrialError, TpmError, OSError) as exc:
        print(f"trusted-trial: {exc}", file=sys.stderr)
        return 1
    return 0
