"""Policies built from the tenant's own guest image (``trusted-tenant
policy generate``): offline, before any node exists.

Runtime (IMA) policy
    every regular file of the image's root file system (a directory or a
    tar archive, e.g. ``disk-image-create -t qcow2,tar``) and of its
    initramfs (a cpio archive) at its path, plus
    the payload's own digest at the path the agent runs it from
    (:data:`PAYLOAD_PATH`), with :data:`DEFAULT_EXCLUDES` for the state
    cloud-init, systemd and the agent write at boot and then read as root
    (``ima_policy=tcb`` measures every file root reads). The excludes name
    data files one by one; none covers a directory where a program could be
    put and run (``/root``, ``/var/tmp``, ``/usr/local``, the agent's
    payload), so an unknown program there is still refused.

Measured-boot policy
    the kernel's Authenticode digest (UEFI firmware measures the kernel it
    starts as an ``EV_EFI_BOOT_SERVICES_APPLICATION``), the firmware blob
    digests the cloud provider publishes for its firmware (e.g. its OVMF
    build; optional), and the Secure Boot state. When qemu loads the kernel
    itself (Nova's ``kernel_id``/``ramdisk_id`` image properties: libvirt's
    direct kernel boot), qemu writes into the kernel's setup header before
    OVMF measures it (:func:`qemu_direct_boot_kernel`): the digest then
    depends on the initramfs size and the flavor's memory too.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import struct
from collections.abc import Iterable, Sequence
from typing import Any

from nova_plugin.debpolicy import (
    add_package_arguments,
    extra_files,
    package_allowlist,
    packages_from_args,
    rule_digests,
    rule_excludes,
)
from nova_plugin.exceptions import TenantError, UsageError
from nova_plugin.imagepolicy import measured_boot_from_image
from verifier.common.diskimage import DiskImageError
from verifier.common.imagefiles import (
    Digests,
    ImageFilesError,
    cpio_files,
    tar_files,
    tree_files,
)
from verifier.protocol import MalformedError
from verifier.protocol.ima import RuntimePolicy
from verifier.protocol.mb import MeasuredBootPolicy
from verifier.protocol.mb import parse as parse_event_log
from verifier.protocol.mb.authenticode import pe_authenticode_digest
from verifier.protocol.mb.policy import policy_from_log

__all__ = [
    "DEFAULT_EXCLUDES",
    "INITRAMFS_READS_OF_ROOT",
    "PAYLOAD_PATH",
    "add_generate_parser",
    "generate",
    "measured_boot_from_image",
    "measured_boot_policy",
    "qemu_direct_boot_kernel",
    "runtime_policy",
]

#: Where the agent writes the decrypted payload and runs it from.
PAYLOAD_PATH = "/var/lib/trusted-cloud-agent/payload"

#: Files written at boot (not in the image, or changed from it) that root
#: reads and IMA measures, found by booting the image (see
#: doc/source/user/image-policies.rst). Each pattern is anchored at both
#: ends and names data files, never a directory where a program could be
#: put and run: an unknown program in /root, /var/tmp, /usr/local or the
#: agent's work directory is still refused.
DEFAULT_EXCLUDES: tuple[str, ...] = (
    # systemd: the machine id made at first boot, its random seed, the
    # journal read back by journald (also one it archived, or set aside as
    # corrupt after a crash: system@...journal~), e2fsprogs' test of a
    # writable root
    r"/etc/machine-id$",
    r"/var/lib/dbus/machine-id$",
    r"/var/lib/systemd/random-seed$",
    r"/var/log/journal/[0-9a-f]{32}/system(@[0-9a-f-]+)?\.journal~?$",
    r"/\.ismount-test-file$",
    # cloud-init: its seed (NoCloud or config drive, mounted under /run),
    # the instance's data (not its scripts), the host name, the default
    # user it adds and the SSH keys it writes (data, not programs)
    r"/run/cloud-init/tmp/[^/]+/(user-data|meta-data|vendor-data|network-config)$",
    r"/run/cloud-init/tmp/[^/]+/(openstack|ec2)/[^/]+/[^/]+\.json$",
    r"/run/cloud-init/tmp/[^/]+/openstack/[^/]+/(user|vendor)_data$",
    r"/var/lib/cloud/instances/[^/]+/(?!scripts/)[^/]+$",
    r"/var/lib/cloud/data/[^/]+$",
    r"/etc/(hostname|hosts)$",
    r"/etc/(passwd|group|shadow|gshadow)$",
    r"/root/\.ssh/authorized_keys$",
    r"/home/[^/]+/\.ssh/authorized_keys$",
    r"/etc/systemd/network/10-cloud-init-[^/]+\.network$",
    # udev's device database. In the running system /run is tmpfs, which
    # ima_policy=tcb does not measure; but on a slow host the initramfs's
    # udevd may still be writing its database (a temporary file made with
    # O_RDWR for each device, then renamed) after /run was moved to the
    # real root, and its files then land in the initramfs's own root, a
    # ramfs, which is measured: seen as a guest revoked at its first quote
    # for /run/udev/data/.#c10:235... (the digest of an empty file). Only
    # udevd writes this directory, and nothing there is ever run.
    r"/run/udev/data/[^/]+$",
    # the node's bootstrap configuration and the provider's agent settings
    r"/etc/trusted-cloud/bootstrap\.json$",
    r"/etc/trusted-cloud/agent\.conf\.d/[^/]+\.conf$",
    # the agent's kept TLS key and certificate, the bootstrap file's CA
    # as it writes it, the payload's output
    r"/var/lib/trusted-cloud-agent/"
    r"(tls-key|tls-cert|identity-key|identity-cert|bootstrap-ca)\.pem$",
    r"/var/lib/trusted-cloud-agent/payload\.(out|status)$",
)

#: Files of the root file system the initramfs reads before it switches to
#: it (mounted at /root): Debian's initramfs-tools reads its fstab.
INITRAMFS_READS_OF_ROOT = ("/etc/fstab",)


def runtime_policy(
    files: Iterable[tuple[str, Digests]],
    name: str,
    version: int,
    *,
    excludes: Sequence[str] = DEFAULT_EXCLUDES,
    payloads: Sequence[bytes] = (),
    payload_path: str = PAYLOAD_PATH,
) -> RuntimePolicy:
    """An allowlist of an image's files and the payloads it will run.

    Args:
        files: (path, digests) of the image's regular files (its root and
            its initramfs); the root's :data:`INITRAMFS_READS_OF_ROOT` are
            also allowed as the initramfs sees them (under ``/root``).
        name: The policy's name.
        version: Its version.
        excludes: Regular expressions of paths not checked.
        payloads: Payloads (plaintext) the agent may run at ``payload_path``.
        payload_path: Where the agent writes the payload.

    Returns:
        The policy.

    Raises:
        MalformedError: an invalid exclude.
    """
    allow: dict[str, set[tuple[str, bytes]]] = {}
    for path, digests in files:
        allow.setdefault(path, set()).update(digests)
    for path in INITRAMFS_READS_OF_ROOT:
        if path in allow:
            allow.setdefault("/root" + path, set()).update(allow[path])
    for payload in payloads:
        allow.setdefault(payload_path, set()).add(
            ("sha256", hashlib.sha256(payload).digest())
        )
    return RuntimePolicy(name, version, allow, excludes)


# qemu (hw/i386/x86.c, x86_load_linux) for a boot protocol >= 2.02 kernel:
# the real-mode code at 0x10000, the command line at 0x20000, and the
# ACPI tables' room below the top of low memory (pc machines since 2.x).
_QEMU_REAL_ADDR, _QEMU_CMDLINE_ADDR, _QEMU_ACPI_DATA_SIZE = 0x10000, 0x20000, 0x28000
_XLF_CAN_BE_LOADED_ABOVE_4G = 1 << 1


def qemu_direct_boot_kernel(kernel: bytes, initrd_size: int, memory_mb: int) -> bytes:
    """The kernel as OVMF measures it when qemu (7.2, q35) loads it with
    ``-kernel``/``-initrd`` (what libvirt does for Nova's ``kernel_id``).

    qemu writes five fields of the Linux setup header (Documentation/x86/
    boot.rst) before handing the kernel to the firmware: the loader type
    (0xB0), the can-use-heap flag and the heap end, the command line's
    address, and the initramfs's address (the top of low memory below the
    ACPI tables, 4 KiB aligned) and size.

    Args:
        kernel: The ``vmlinuz``.
        initrd_size: The initramfs's size in bytes.
        memory_mb: The VM's memory (the flavor's RAM).

    Returns:
        The kernel with the setup header qemu writes.

    Raises:
        MalformedError: not a Linux boot protocol >= 2.02 kernel.
    """
    if len(kernel) < 0x240 or kernel[0x202:0x206] != b"HdrS":
        raise MalformedError("kernel", "no Linux setup header (HdrS)")
    (protocol,) = struct.unpack_from("<H", kernel, 0x206)
    if protocol < 0x202:
        raise MalformedError("kernel", f"boot protocol {protocol:#x} before 2.02")
    memory = memory_mb << 20
    # q35 keeps up to 2 GiB below 4 GiB when the VM has 2.75 GiB or more
    low = memory if memory < 0xB0000000 else 0x80000000
    initrd_max = 0x37FFFFFF
    if protocol >= 0x203:
        (initrd_max,) = struct.unpack_from("<I", kernel, 0x22C)
    if protocol >= 0x20C:
        (xload,) = struct.unpack_from("<H", kernel, 0x236)
        if xload & _XLF_CAN_BE_LOADED_ABOVE_4G:
            initrd_max = 0xFFFFFFFF
    initrd_max = min(initrd_max, low - _QEMU_ACPI_DATA_SIZE - 1)
    header = bytearray(kernel[:0x240])
    header[0x210] = 0xB0
    header[0x211] |= 0x80
    heap_end = _QEMU_CMDLINE_ADDR - _QEMU_REAL_ADDR - 0x200
    struct.pack_into("<H", header, 0x224, heap_end)
    struct.pack_into("<I", header, 0x228, _QEMU_CMDLINE_ADDR)
    struct.pack_into(
        "<II", header, 0x218, (initrd_max - initrd_size) & ~0xFFF, initrd_size
    )
    return bytes(header) + kernel[0x240:]


def measured_boot_policy(
    kernel: bytes,
    firmware: Iterable[bytes] | None = None,
    secure_boot: bool | None = None,
) -> MeasuredBootPolicy:
    """The measured-boot policy of a kernel started directly by UEFI firmware.

    Args:
        kernel: The image's ``vmlinuz`` (a PE image with the EFI stub).
        firmware: The provider's firmware blob digests (None: not checked).
        secure_boot: The Secure Boot state to require (None: not checked).

    Raises:
        MalformedError: the kernel is not a PE image.
    """
    apps = frozenset({pe_authenticode_digest(kernel)})
    blobs = None if firmware is None else frozenset(firmware)
    return MeasuredBootPolicy(apps, blobs, secure_boot)


def add_generate_parser(policy_sub: Any) -> argparse.ArgumentParser:
    """``trusted-tenant policy generate {runtime,measured-boot}``; its parser."""
    gen: argparse.ArgumentParser = policy_sub.add_parser(
        "generate", help="build a policy from a guest image (offline)"
    )
    kinds = gen.add_subparsers(dest="generate_kind", required=True)
    run = kinds.add_parser(
        "runtime",
        help="IMA allowlist of an image's files or of Debian packages",
    )
    source = run.add_mutually_exclusive_group(required=True)
    source.add_argument("--rootfs", help="the image's root directory")
    source.add_argument("--tar", help="a tar archive of the image's root")
    add_package_arguments(run, source)
    run.add_argument(
        "--initrd",
        help="the image's initramfs (its files are measured before the root "
        "is mounted)",
    )
    run.add_argument("--name", required=True, help="the policy's name")
    run.add_argument("--version", type=int, default=1, help="default: 1")
    run.add_argument(
        "--payload",
        action="append",
        default=[],
        help=f"a payload the agent will run at {PAYLOAD_PATH} (repeatable)",
    )
    run.add_argument(
        "--exclude", action="append", default=[], metavar="REGEX",
        help="another path not checked (repeatable)",
    )  # fmt: skip
    run.add_argument(
        "--no-default-excludes",
        action="store_true",
        help="leave out the excludes of state written at boot",
    )
    mb = kinds.add_parser(
        "measured-boot",
        help="kernel and firmware digests, or a disk image's Secure Boot chain",
    )
    source = mb.add_mutually_exclusive_group(required=True)
    source.add_argument("--kernel", help="the image's vmlinuz")
    source.add_argument(
        "--image",
        metavar="FILE",
        help="a raw or qcow2 whole-disk image booted by shim and GRUB under "
        "Secure Boot: pin shim, GRUB, every kernel, command line and initrd "
        "its GRUB menu boots",
    )
    source.add_argument(
        "--event-log",
        metavar="FILE",
        help="a known-good boot's firmware event log (binary_bios_measurements):"
        " allow its boot applications and firmware, require its Secure Boot state",
    )
    mb.add_argument(
        "--qemu-direct-boot", nargs=2, metavar=("INITRD", "MEMORY_MB"),
        help="qemu loads the kernel (Nova's kernel_id/ramdisk_id): the "
        "initramfs file and the flavor's RAM in MiB",
    )  # fmt: skip
    mb.add_argument(
        "--firmware-digest", action="append", default=None, metavar="SHA256",
        help="a firmware blob digest the provider publishes (repeatable; "
        "default: firmware not checked)",
    )  # fmt: skip
    mb.add_argument("--secure-boot", choices=("on", "off"), help="require this state")
    mb.add_argument(
        "--vars", metavar="OVMF_VARS.fd",
        help="with --image: the OVMF variable store the VM starts with; pins its "
        "PK, KEK, db and dbx (default: the key databases are not pinned)",
    )  # fmt: skip
    mb.add_argument(
        "--keep", metavar="FILE",
        help="with --image: a previous version of the policy whose kernels, "
        "command lines and initrds stay allowed (kernel rollover)",
    )  # fmt: skip
    for cmd in (run, mb):
        cmd.add_argument("-o", "--output", required=True, help="JSON to write")
    return gen


def generate(args: argparse.Namespace) -> dict[str, Any]:
    """Run ``policy generate``; the message to print.

    Raises:
        TenantError: unreadable input or an invalid exclude or digest.
    """
    try:
        if args.generate_kind == "runtime":
            document, what = _runtime(args)
        else:
            document, what = _measured_boot(args)
    except UsageError:
        raise
    except (ImageFilesError, MalformedError, ValueError, OSError) as exc:
        raise TenantError(f"policy generate {args.generate_kind}: {exc}")
    with open(args.output, "w", encoding="utf-8") as out:
        json.dump(document, out, indent=1, sort_keys=True)
    return {"message": f"wrote {args.output}: {what}"}


def _runtime(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    if args.deb or args.apt_repo:
        return _from_packages(args)
    files = list(tar_files(args.tar) if args.tar else tree_files(args.rootfs))
    if args.initrd:
        files += cpio_files(args.initrd)
    payloads = []
    for path in args.payload:
        with open(path, "rb") as handle:
            payloads.append(handle.read())
    excludes = [] if args.no_default_excludes else list(DEFAULT_EXCLUDES)
    policy = runtime_policy(
        files,
        args.name,
        args.version,
        excludes=excludes + args.exclude,
        payloads=payloads,
    )
    document = policy.to_dict()
    return document, (
        f"runtime policy {args.name!r} v{args.version}: "
        f"{len(document['digests'])} files, {len(excludes + args.exclude)} excludes"
    )


def _from_event_log(path: str) -> tuple[dict[str, Any], str]:
    with open(path, "rb") as handle:
        events = parse_event_log(handle.read()).events
    policy = policy_from_log(events)
    apps = len(policy.boot_applications or ())
    blobs = len(policy.firmware or ())
    return policy.to_dict(), (
        f"measured-boot policy from {path}: {apps} boot applications, "
        f"{blobs} firmware events, Secure Boot "
        f"{ {None: 'not checked', True: 'on', False: 'off'}[policy.secure_boot] }"
    )


def _from_image(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    if args.qemu_direct_boot or args.firmware_digest or args.secure_boot:
        raise UsageError(
            "--image takes the chain from the image: no --qemu-direct-boot,"
            " --firmware-digest or --secure-boot"
        )
    try:
        keep = None
        if args.keep is not None:
            with open(args.keep, encoding="utf-8") as handle:
                keep = json.load(handle)
        document = measured_boot_from_image(args.image, args.vars, keep)
    except (DiskImageError, MalformedError, OSError, ValueError) as exc:
        raise UsageError(f"policy generate measured-boot --image: {exc}") from None
    keys = (
        "PK, KEK, db and dbx pinned from " + args.vars
        if args.vars
        else "key databases not pinned (no --vars)"
    )
    return document, (
        f"measured-boot policy from {args.image}: shim, GRUB, "
        f"{len(document['kernels'])} kernels, {len(document['kernel_cmdlines'])} "
        f"command lines, {len(document['initrds'])} initrds; Secure Boot on; {keys}"
    )


def _measured_boot(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    if args.image is None and (args.vars or args.keep):
        raise ValueError("--vars and --keep go with --image")
    if args.image is not None:
        return _from_image(args)
    if args.event_log is not None:
        if args.qemu_direct_boot or args.firmware_digest or args.secure_boot:
            raise ValueError(
                "--event-log takes everything from the log: no --qemu-direct-boot,"
                " --firmware-digest or --secure-boot"
            )
        return _from_event_log(args.event_log)
    with open(args.kernel, "rb") as handle:
        kernel = handle.read()
    if args.qemu_direct_boot is not None:
        initrd, memory_mb = args.qemu_direct_boot
        if not memory_mb.isdigit() or int(memory_mb) < 64:
            raise ValueError(
                f"MEMORY_MB must be the flavor's RAM in MiB: {memory_mb!r}"
            )
        size = os.path.getsize(initrd)
        kernel = qemu_direct_boot_kernel(kernel, size, int(memory_mb))
    firmware = None
    if args.firmware_digest is not None:
        firmware = [bytes.fromhex(d) for d in args.firmware_digest]
        if any(len(d) != 32 for d in firmware):
            raise ValueError("a firmware digest is not a sha256 hex digest")
    secure_boot = None if args.secure_boot is None else args.secure_boot == "on"
    policy = measured_boot_policy(kernel, firmware, secure_boot)
    app = next(iter(policy.boot_applications or ()))
    return policy.to_dict(), f"measured-boot policy, kernel {app.hex()[:16]}..."


def _from_packages(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """``--deb``/``--apt-repo``: the packages' files and the named rules."""
    if args.initrd or args.no_default_excludes:
        raise UsageError("--initrd and --no-default-excludes go with --rootfs/--tar")
    packages = packages_from_args(args)
    names = [n for n in re.split(r"[,\s]+", args.rules) if n]
    excludes = rule_excludes(names, packages)
    if args.boot_excludes:
        excludes += [e for e in DEFAULT_EXCLUDES if e not in excludes]
    allow = package_allowlist(packages)
    for path, digest in rule_digests(names) + extra_files(args.file):
        allow.setdefault(path, set()).add(("sha256", digest))
    payloads = []
    for path in args.payload:
        with open(path, "rb") as handle:
            payloads.append(handle.read())
    for payload in payloads:
        allow.setdefault(PAYLOAD_PATH, set()).add(
            ("sha256", hashlib.sha256(payload).digest())
        )
    excludes += [e for e in args.exclude if e not in excludes]
    document = RuntimePolicy(args.name, args.version, allow, excludes).to_dict()
    files = sum(len(p.files) for p in packages)
    return document, (
        f"runtime policy {args.name!r} v{args.version}: {len(packages)} packages, "
        f"{files} files, {len(document['digests'])} paths, {len(excludes)} "
        f"excludes (rules: {', '.join(names) or 'none'})"
    )
