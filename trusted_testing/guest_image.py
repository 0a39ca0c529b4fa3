"""Build the tiny measured guest: a Debian kernel, a busybox initramfs and a
squashfs of measured content, cached between runs.

Everything comes from Debian packages through their ordinary clients: the
kernel with ``apt-get download`` (extracted with ``dpkg-deb -x``, never
installed on the host) and busybox from the host's ``busybox-static``. The
result lives in a cache directory (``$TRUSTED_GUEST_CACHE`` or
``~/.cache/trusted-cloud/guest``), one sub-directory per kernel version:

* ``vmlinuz``: the kernel (TPM CRB/TIS and IMA built in);
* ``initrd.img``: busybox, the virtio and squashfs modules and ``/init``;
* ``measured.squashfs``: what IMA measures at boot, on a real filesystem
  (``ima_policy=tcb`` ignores tmpfs and ramfs): a copy of busybox, a script,
  a configuration file and the ext4 modules of the kernel package;
* ``writable/``: the tree of the per-run writable ext4 disk (a script that is
  run at boot, so that a test can tamper with it).

Run ``python -m trusted_testing.guest_image`` (or ``tools/guest/build.sh``)
to build it ahead of time; :class:`trusted_testing.guest.Guest` builds it on
first use.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

KERNEL_META = "linux-image-amd64"
BUSYBOX = "/bin/busybox"
# Loaded from the initramfs (not measured: the initramfs is a tmpfs).
INITRD_MODULES = ("virtio_pci", "virtio_blk", "squashfs")
# Loaded from the squashfs, so IMA measures them (MODULE_CHECK).
MEASURED_MODULES = ("crc32c_generic", "ext4")
# tpm2-tools (one multi-call binary) for a quote made in the guest, and the
# TCTI its loader opens at run time (which ldd does not show).
TPM2 = "/usr/bin/tpm2"
TPM2_TOOLS = (
    "tpm2_createek",
    "tpm2_createak",
    "tpm2_quote",
    "tpm2_startauthsession",
    "tpm2_policysecret",
    "tpm2_activatecredential",
    "tpm2_flushcontext",
)
MULTIARCH = "/usr/lib/x86_64-linux-gnu"
TCTI = "libtss2-tcti-device.so.0"
_STAMP = ".complete"
_DEPENDS = re.compile(rb"(?:^|\x00)depends=([^\x00]*)\x00")

INIT = r"""#!/bin/busybox sh
# /init of the measured guest (written by trusted_testing.guest_image).
/bin/busybox --install -s /bin
mkdir -p /proc /sys /dev /tmp /state /m /w
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t securityfs securityfs /sys/kernel/security
for mod in $(cat /modules/modules.list); do insmod "/modules/$mod.ko"; done
mount -t squashfs -o ro /dev/vda /m || echo "@@FAIL squashfs"
for mod in $(cat /m/lib/modules/modules.list); do
    insmod "/m/lib/modules/$mod.ko" || echo "@@FAIL insmod $mod"
done
mount -t ext4 /dev/vdb /w || echo "@@FAIL ext4"
# tpm2-tools and its libraries live on the squashfs too (so IMA measures
# them); the attestation key is made at boot, as an agent would.
ln -s /m/lib /lib; ln -s /m/lib64 /lib64; ln -s /m/usr /usr
export PATH=/bin:/usr/bin TPM2TOOLS_TCTI=device:/dev/tpmrm0
tpm2_createek -c /state/ek.ctx -G rsa -u /state/ek.pub >/dev/null \
    || echo "@@FAIL createek"
tpm2_createak -C /state/ek.ctx -c /state/ak.ctx -G ecc -g sha256 -s ecdsa \
    -u /state/ak.pub -n /state/ak.name >/dev/null || echo "@@FAIL createak"
# The measured workload: an executable, a script, a file read by root.
/m/bin/busybox true
/m/bin/hello.sh
cat /m/etc/motd
/w/bin/tool.sh
dmesg -n 1
stty -echo 2>/dev/null
echo "@@READY"
export PS1=""
exec sh
"""

HELLO = "#!/bin/sh\necho hello from a measured script\n"
MOTD = "This file lives on a squashfs, so IMA measures it when root reads it.\n"
TOOL = "#!/bin/sh\necho tool ok\n"


class ImageError(Exception):
    """Building the guest image failed (a missing tool or package)."""


@dataclass(frozen=True)
class GuestImage:
    """The built guest, ready to boot.

    Attributes:
        directory: The cache sub-directory holding everything below.
        kernel: Path of the kernel image.
        initrd: Path of the initramfs.
        squashfs: Path of the read-only measured disk.
        writable_tree: Directory whose content becomes the writable ext4 disk.
        kernel_version: The kernel release (e.g. ``6.1.0-56-amd64``).
    """

    directory: str
    kernel: str
    initrd: str
    squashfs: str
    writable_tree: str
    kernel_version: str


def cache_dir() -> str:
    """The cache directory (``$TRUSTED_GUEST_CACHE`` or the user's cache)."""
    env = os.environ.get("TRUSTED_GUEST_CACHE")
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(base, "trusted-cloud", "guest")


def _run(argv: list[str], cwd: str | None = None) -> str:
    try:
        done = subprocess.run(
            argv, cwd=cwd, capture_output=True, text=True, check=False
        )
    except FileNotFoundError as exc:
        raise ImageError(f"{argv[0]} is missing (see tools/apt-packages.txt)") from exc
    if done.returncode:
        raise ImageError(
            f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-800:]}"
        )
    return done.stdout


def kernel_package() -> str:
    """The versioned kernel package ``linux-image-amd64`` depends on."""
    out = _run(["apt-cache", "depends", KERNEL_META])
    for line in out.splitlines():
        name = line.strip().removeprefix("Depends:").strip()
        if line.strip().startswith("Depends:") and name.startswith("linux-image-"):
            return name
    raise ImageError(f"apt-cache knows no {KERNEL_META} (run apt-get update)")


def _download_kernel(root: str, package: str) -> str:
    debs = glob.glob(os.path.join(root, f"{package}_*.deb"))
    if not debs:
        _run(["apt-get", "download", package], cwd=root)
        debs = glob.glob(os.path.join(root, f"{package}_*.deb"))
    if not debs:
        raise ImageError(f"apt-get download {package} produced no .deb")
    return sorted(debs)[-1]


def _module_index(modroot: str) -> dict[str, str]:
    index = {}
    for path in glob.glob(
        os.path.join(modroot, "kernel", "**", "*.ko"), recursive=True
    ):
        index[os.path.basename(path)[:-3].replace("-", "_")] = path
    return index


def module_closure(index: dict[str, str], names: tuple[str, ...]) -> list[str]:
    """Modules to load, dependencies first (read from each ``.modinfo``).

    Args:
        index: Module name to ``.ko`` path.
        names: The modules wanted.

    Returns:
        Module names in a loadable order.

    Raises:
        ImageError: If a module is not in the kernel package.
    """
    order: list[str] = []

    def visit(name: str) -> None:
        if name in order:
            return
        if name not in index:
            raise ImageError(f"module {name} is not in the kernel package")
        with open(index[name], "rb") as handle:
            found = _DEPENDS.search(handle.read())
        deps = found.group(1).decode() if found else ""
        for dep in filter(None, deps.split(",")):
            visit(dep.replace("-", "_"))
        order.append(name)

    for name in names:
        visit(name)
    return order


def _copy_modules(index: dict[str, str], names: list[str], dest: str) -> None:
    os.makedirs(dest, exist_ok=True)
    for name in names:
        shutil.copyfile(index[name], os.path.join(dest, name + ".ko"))
    with open(os.path.join(dest, "modules.list"), "w", encoding="ascii") as handle:
        handle.write("\n".join(names) + "\n")


def _write(path: str, text: str, mode: int = 0o644) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="ascii") as handle:
        handle.write(text)
    os.chmod(path, mode)


def _build_initrd(work: str, index: dict[str, str], out: str) -> None:
    tree = os.path.join(work, "initrd")
    os.makedirs(os.path.join(tree, "bin"))
    shutil.copyfile(BUSYBOX, os.path.join(tree, "bin", "busybox"))
    os.chmod(os.path.join(tree, "bin", "busybox"), 0o755)  # noqa: S103
    names = module_closure(index, INITRD_MODULES)
    _copy_modules(index, names, os.path.join(tree, "modules"))
    _write(os.path.join(tree, "init"), INIT, 0o755)
    files = subprocess.run(
        ["find", ".", "-mindepth", "1"], cwd=tree, capture_output=True, check=True
    ).stdout
    with open(out, "wb") as handle:
        subprocess.run(
            ["cpio", "-o", "-H", "newc", "--quiet"],
            cwd=tree,
            input=files,
            stdout=handle,
            check=True,
        )


def shared_libraries(paths: list[str]) -> list[str]:
    """The shared libraries ``paths`` load (``ldd``), the loader included."""
    found: list[str] = []
    for path in paths:
        for line in _run(["ldd", path]).splitlines():
            parts = line.split()
            lib = parts[2] if len(parts) > 2 and parts[1] == "=>" else parts[0]
            if lib.startswith("/") and lib not in found:
                found.append(lib)
    return found


def _copy_tpm2_tools(tree: str) -> None:
    if not os.path.exists(TPM2):
        raise ImageError(f"{TPM2} is missing: install tpm2-tools")
    tcti = os.path.join(MULTIARCH, TCTI)
    for path in [TPM2, tcti, *shared_libraries([TPM2, tcti])]:
        dest = os.path.join(tree, path.lstrip("/"))
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(os.path.realpath(path), dest)
        os.chmod(dest, 0o755)  # noqa: S103
    for tool in TPM2_TOOLS:
        os.symlink("tpm2", os.path.join(tree, "usr", "bin", tool))


def _build_squashfs(work: str, index: dict[str, str], out: str) -> None:
    tree = os.path.join(work, "measured")
    os.makedirs(os.path.join(tree, "bin"))
    shutil.copyfile(BUSYBOX, os.path.join(tree, "bin", "busybox"))
    os.chmod(os.path.join(tree, "bin", "busybox"), 0o755)  # noqa: S103
    _write(os.path.join(tree, "bin", "hello.sh"), HELLO, 0o755)
    _write(os.path.join(tree, "etc", "motd"), MOTD)
    initrd_mods = set(module_closure(index, INITRD_MODULES))
    names = [m for m in module_closure(index, MEASURED_MODULES) if m not in initrd_mods]
    _copy_modules(index, names, os.path.join(tree, "lib", "modules"))
    _copy_tpm2_tools(tree)
    _run(["mksquashfs", tree, out, "-comp", "gzip", "-all-root", "-noappend", "-quiet"])


def build(root: str | None = None, *, rebuild: bool = False) -> GuestImage:
    """Build the guest image into the cache (or return the cached one).

    Args:
        root: Cache directory (default :func:`cache_dir`).
        rebuild: Build again even when a complete image is cached.

    Returns:
        The image.

    Raises:
        ImageError: If a tool or package is missing.
    """
    root = root or cache_dir()
    os.makedirs(root, exist_ok=True)
    with cache_lock(root):
        return _build(root, rebuild)


@contextlib.contextmanager
def cache_lock(root: str) -> Iterator[None]:
    """Serialize builds sharing one cache (several test runs, worktrees)."""
    with open(os.path.join(root, ".lock"), "w", encoding="ascii") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _refresh_lists() -> None:
    """``apt-get update`` (as root only), when the lists name a kernel the
    archive no longer has."""
    if os.geteuid() != 0:
        raise ImageError("apt-get download failed: run apt-get update and try again")
    _run(["apt-get", "-oDPkg::Lock::Timeout=900", "update", "-qq"])


def recipe_digest() -> str:
    """A digest of what goes into the image besides the kernel package, so
    that a changed init script or module list rebuilds the cached image."""
    recipe = [INIT, HELLO, MOTD, TOOL, *INITRD_MODULES, "|", *MEASURED_MODULES]
    recipe += [TPM2, TCTI, *TPM2_TOOLS]
    return hashlib.sha256("\0".join(recipe).encode()).hexdigest()[:16]


def _stamp_matches(path: str) -> bool:
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().split(" ", 1)[0] == recipe_digest()
    except OSError:
        return False


def _build(root: str, rebuild: bool, refreshed: bool = False) -> GuestImage:
    try:
        package = kernel_package()
    except ImageError:
        if refreshed:
            raise
        _refresh_lists()
        return _build(root, rebuild, True)
    version = package.removeprefix("linux-image-")
    target = os.path.join(root, version)
    image = GuestImage(
        directory=target,
        kernel=os.path.join(target, "vmlinuz"),
        initrd=os.path.join(target, "initrd.img"),
        squashfs=os.path.join(target, "measured.squashfs"),
        writable_tree=os.path.join(target, "writable"),
        kernel_version=version,
    )
    if not rebuild and _stamp_matches(os.path.join(target, _STAMP)):
        return image
    if not os.path.exists(BUSYBOX):
        raise ImageError(f"{BUSYBOX} is missing: install busybox-static")
    try:
        deb = _download_kernel(root, package)
    except ImageError:
        if refreshed:
            raise
        _refresh_lists()
        return _build(root, rebuild, True)
    shutil.rmtree(target, ignore_errors=True)
    os.makedirs(target)
    with tempfile.TemporaryDirectory(prefix="guest-build-", dir=root) as work:
        extracted = os.path.join(work, "deb")
        _run(["dpkg-deb", "-x", deb, extracted])
        shutil.copyfile(
            os.path.join(extracted, "boot", f"vmlinuz-{version}"), image.kernel
        )
        modroot = glob.glob(os.path.join(extracted, "lib", "modules", "*"))
        if not modroot:
            raise ImageError(f"{deb} holds no modules")
        index = _module_index(modroot[0])
        _build_initrd(work, index, image.initrd)
        _build_squashfs(work, index, image.squashfs)
    _write(os.path.join(image.writable_tree, "bin", "tool.sh"), TOOL, 0o755)
    with open(os.path.join(target, _STAMP), "w", encoding="ascii") as handle:
        handle.write(f"{recipe_digest()} {os.path.basename(deb)}\n")
    os.unlink(deb)  # 70 MB; the image is what is kept
    return image


def make_writable_disk(image: GuestImage, path: str, size_mb: int = 16) -> None:
    """Create a fresh ext4 disk image holding ``image.writable_tree``.

    Args:
        image: The guest image.
        path: The disk image file to create.
        size_mb: Its size in MiB.
    """
    _run(["mkfs.ext4", "-q", "-F", "-d", image.writable_tree, path, f"{size_mb}M"])


def main(argv: list[str] | None = None) -> int:
    """Command line: build the guest image and print where it is."""
    parser = argparse.ArgumentParser(
        description="Build the measured test guest (kernel, initramfs, squashfs)."
    )
    parser.add_argument(
        "--cache", help="cache directory (default: %(default)s)", default=cache_dir()
    )
    parser.add_argument(
        "--rebuild", action="store_true", help="build again even if cached"
    )
    args = parser.parse_args(argv)
    try:
        image = build(args.cache, rebuild=args.rebuild)
    except ImageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for name in ("kernel", "initrd", "squashfs"):
        path = getattr(image, name)
        print(f"{name}: {path} ({os.path.getsize(path)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
