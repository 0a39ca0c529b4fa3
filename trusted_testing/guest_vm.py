"""Build the operator's guest image with diskimage-builder, cached per machine.

The image is what ``doc/source/admin/guest-image.rst`` describes: Debian 12
(bookworm) from ``debian-minimal``, the Debian 6.1 kernel, cloud-init for
the NoCloud and ConfigDrive datasources, and the node agent installed from
the project's own wheel with its ``agent`` extra into ``/opt/trusted-agent``
with a ``trusted-agent.service`` unit (the ``trusted-agent`` element in
``elements/``).

These machines cannot make a whole-disk image: diskimage-builder partitions
it with ``kpartx``, and the kernel here has no device-mapper. So the build
uses the elements ``debian-minimal baremetal trusted-agent`` without ``vm``:
the qcow2 holds the root filesystem alone (a *partition image*, labelled
``cloudimg-rootfs``), and the ``baremetal`` element puts the kernel and the
initramfs beside it. Nova boots such an image with the ``kernel_id``,
``ramdisk_id`` and ``os_command_line`` image properties; OVMF measures the
kernel into PCR 4 and the kernel's EFI stub the initramfs into PCR 9, as
for the measured test guest (:mod:`trusted_testing.guest_image`).

Inputs that key the cache (``$TRUSTED_GUEST_VM_CACHE`` or
``~/.cache/trusted-cloud/guest-vm``): the element's files, the elements
list, the Debian release, the diskimage-builder version, and the project's
shipped sources (its packages without their tests, ``setup.cfg``,
``requirements.txt``). A change to any of them builds a new image; the
newest :data:`KEEP` images are kept.

Run ``python -m trusted_testing.guest_vm build [--rebuild]`` (or
``tools/guest/build-vm.sh``) to build ahead of time. A developer changing
tests only may set ``TRUSTED_GUEST_VM_REUSE=1`` to boot the newest cached
image whatever shipped code it was built from.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from email.parser import HeaderParser

from trusted_testing.guest_image import cache_lock

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ELEMENTS_PATH = os.path.join(REPO, "elements")
ELEMENT = "trusted-agent"
ELEMENTS = ("debian-minimal", "baremetal", ELEMENT)
# The qcow2 boots; the tar of the same tree is the input of runtime policies.
IMAGE_TYPES = ("qcow2", "tar")
RELEASE = "bookworm"
DIB_VERSION = "3.43.0"
IMAGE_NAME = "trusted-agent"
ROOT_LABEL = "cloudimg-rootfs"
# The kernel command line of a direct kernel boot (Glance os_command_line):
# the IMA policy and hash of the measured test guest.
CMDLINE = (
    f"root=LABEL={ROOT_LABEL} ro console=ttyS0 "
    "ima_policy=tcb ima_hash=sha256 no_timer_check"
)
# The project's packages whose sources go into the wheel (setup.cfg [files]).
PACKAGES = (
    "verifier",
    "node_agent",
    "nova_plugin",
    "vtpm_manager",
    "ipsec_puppet_vault_hooks",
)
KEEP = 2
# The host's Debian python3: it makes the tools venv and builds the wheels.
HOST_PYTHON = "/usr/bin/python3"
# Host tools diskimage-builder runs, and the Debian package of each.
HOST_TOOLS = {
    "debootstrap": "debootstrap",
    "qemu-img": "qemu-utils",
    "sudo": "sudo",
    "losetup": "mount",
    "mkfs.ext4": "e2fsprogs",
    "chroot": "coreutils",
    "python3": "python3-venv",
}
_BUILD_JSON = "build.json"


class ImageError(Exception):
    """Building the guest image failed (a missing tool, or a build step)."""


@dataclass(frozen=True)
class VmImage:
    """A built guest image.

    Attributes:
        directory: The cache sub-directory holding the files below.
        qcow2: The root filesystem image (a partition image, no bootloader).
        kernel: The kernel (``vmlinuz``) extracted from the image.
        initrd: The initramfs extracted from the image.
        tar: The same root file system as a tar archive (what a tenant
            builds its runtime policy from: ``trusted-tenant policy
            generate runtime --tar``).
        wheel: The project's wheel installed in the image (kept beside it).
        key: The digest of the build's inputs.
        build_seconds: How long the build took.
        cmdline: The kernel command line to boot it with.
    """

    directory: str
    qcow2: str
    kernel: str
    initrd: str
    tar: str
    wheel: str
    key: str
    build_seconds: float
    cmdline: str = CMDLINE

    def wheel_extras(self) -> frozenset[str]:
        """The extras the installed wheel declares (``Provides-Extra``)."""
        return wheel_metadata(self.wheel)[1]

    def size(self) -> int:
        """Bytes of the qcow2, the kernel and the initramfs together."""
        return sum(os.path.getsize(p) for p in (self.qcow2, self.kernel, self.initrd))


def cache_dir() -> str:
    """The cache directory (``$TRUSTED_GUEST_VM_CACHE`` or the user's cache)."""
    env = os.environ.get("TRUSTED_GUEST_VM_CACHE")
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(base, "trusted-cloud", "guest-vm")


def wheel_metadata(wheel: str) -> tuple[str, frozenset[str]]:
    """The distribution version and extras of a wheel, from its METADATA.

    Args:
        wheel: Path of the ``.whl`` file.

    Returns:
        The version and the set of ``Provides-Extra`` names.

    Raises:
        ImageError: If the wheel has no METADATA.
    """
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        if not names:
            raise ImageError(f"{wheel} has no METADATA")
        text = archive.read(names[0]).decode()
    headers = HeaderParser().parsestr(text)
    return headers["Version"], frozenset(headers.get_all("Provides-Extra") or [])


def _digest_tree(digest: hashlib._Hash, root: str, skip_tests: bool) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(
            d
            for d in dirnames
            if d != "__pycache__" and not (skip_tests and d == "tests")
        )
        for name in sorted(filenames):
            if name.endswith((".pyc", ".pyo")):
                continue
            path = os.path.join(dirpath, name)
            mode = os.stat(path).st_mode & 0o777
            digest.update(f"{os.path.relpath(path, REPO)}\0{mode:o}\0".encode())
            with open(path, "rb") as handle:
                digest.update(hashlib.sha256(handle.read()).digest())


def input_key() -> str:
    """The digest of everything that goes into the image (see the module doc)."""
    digest = hashlib.sha256()
    inputs = (*ELEMENTS, *IMAGE_TYPES, RELEASE, DIB_VERSION, CMDLINE)
    digest.update("\0".join(inputs).encode())
    _digest_tree(digest, os.path.join(ELEMENTS_PATH, ELEMENT), skip_tests=False)
    for package in PACKAGES:
        _digest_tree(digest, os.path.join(REPO, package), skip_tests=True)
    for name in ("setup.cfg", "requirements.txt"):
        with open(os.path.join(REPO, name), "rb") as handle:
            digest.update(name.encode() + b"\0" + handle.read())
    return digest.hexdigest()[:16]


def _run(
    argv: list[str],
    log: str | None = None,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> str:
    """Run a command and return its output (or append it to ``log``).

    Raises:
        ImageError: If the command is missing or fails.
    """
    try:
        if log is None:
            done = subprocess.run(
                argv, capture_output=True, text=True, env=env, cwd=cwd, check=False
            )
        else:
            with open(log, "ab") as out:
                done = subprocess.run(
                    argv,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    text=True,
                    env=env,
                    cwd=cwd,
                    check=False,
                )
    except FileNotFoundError as exc:
        raise ImageError(f"{argv[0]} is missing (see tools/apt-packages.txt)") from exc
    if done.returncode and log is not None:
        raise ImageError(
            f"{os.path.basename(argv[0])} failed ({done.returncode}); "
            f"see {log}:\n{_tail(log)}"
        )
    if done.returncode:
        raise ImageError(
            f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-800:]}"
        )
    return done.stdout or ""


def _tail(path: str, size: int = 1500) -> str:
    with open(path, "rb") as handle:
        handle.seek(max(0, os.path.getsize(path) - size))
        return handle.read().decode(errors="replace")


def check_host() -> None:
    """Fail early, naming the Debian package, when a build tool is missing.

    Raises:
        ImageError: If a tool is missing, or the build cannot run as root.
    """
    for tool, package in HOST_TOOLS.items():
        if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}"):
            raise ImageError(f"{tool} is missing: install the Debian package {package}")
    if os.geteuid() != 0:
        raise ImageError("diskimage-builder needs root (loop devices, chroot)")
    version = _run([HOST_PYTHON, "-c", "import sys; print(sys.version_info[:2])"])
    if version.strip() != "(3, 11)":
        raise ImageError(
            f"{HOST_PYTHON} is {version.strip()}: the wheels are built by the "
            "host's Debian 12 python3 (3.11), the same as the image's"
        )


def host_mirrors() -> tuple[str, str]:
    """The host's Debian mirror and security mirror (from apt's own sources).

    Returns:
        The URIs serving ``bookworm`` and ``bookworm-security``.

    Raises:
        ImageError: If apt knows no source for the release.
    """
    out = _run(["apt-get", "indextargets", "--format", "$(REPO_URI) $(RELEASE)"])
    found: dict[str, str] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2:
            found.setdefault(parts[1], parts[0])
    if RELEASE not in found:
        raise ImageError(f"apt has no {RELEASE} source (run apt-get update)")
    return found[RELEASE], found.get(f"{RELEASE}-security", found[RELEASE])


def tools_venv(root: str) -> str:
    """A venv of the host's Debian python3 with diskimage-builder, in the cache.

    The wheels of the image are built by this venv's Python, which is the
    image's Python (Debian 12's 3.11.2): pip evaluates the requirements'
    markers, such as ``python_full_version < "3.11.3"``, for it.

    Args:
        root: The cache directory.

    Returns:
        The venv's directory.
    """
    venv = os.path.join(root, f"tools-dib-{DIB_VERSION}")
    if not os.path.exists(os.path.join(venv, "bin", "disk-image-create")):
        shutil.rmtree(venv, ignore_errors=True)
        _run([HOST_PYTHON, "-m", "venv", venv])
        _run(
            [os.path.join(venv, "bin", "pip"), "install", "-q",
             "--disable-pip-version-check", f"diskimage-builder=={DIB_VERSION}"]
        )  # fmt: skip
    return venv


def make_wheelhouse(python: str, out: str) -> str:
    """Build the project's wheel and the wheels of its ``agent`` extra.

    Args:
        python: The Python whose pip builds them (the image's version).
        out: An empty directory for the wheels.

    Returns:
        The project's wheel.

    Raises:
        ImageError: If pip fails.
    """
    pip = [python, "-m", "pip", "--disable-pip-version-check"]
    _run([*pip, "wheel", "-q", "--no-deps", "-w", out, REPO])
    wheels = glob.glob(os.path.join(out, "trusted_cloud-*.whl"))
    if len(wheels) != 1:
        raise ImageError(f"pip wheel made {len(wheels)} project wheels in {out}")
    _run([*pip, "wheel", "-q", "-w", out, "--find-links", out, wheels[0] + "[agent]"])
    return wheels[0]


def _dib_env(root: str, wheelhouse: str) -> dict[str, str]:
    mirror, security = host_mirrors()
    env = dict(os.environ)
    env.update(
        ELEMENTS_PATH=ELEMENTS_PATH,
        DIB_RELEASE=RELEASE,
        DIB_IMAGE_CACHE=os.path.join(root, "dib-cache"),
        DIB_TRUSTED_AGENT_WHEELHOUSE=wheelhouse,
    )
    # Reuse the debootstrap tarball of an earlier build (apt upgrades it).
    env.setdefault("DIB_DEBIAN_USE_DEBOOTSTRAP_CACHE", "1")
    env.setdefault("DIB_DISTRIBUTION_MIRROR", mirror)
    env.setdefault("DIB_DEBIAN_SECURITY_MIRROR", security)
    return env


def _image(directory: str) -> VmImage | None:
    try:
        with open(os.path.join(directory, _BUILD_JSON), encoding="utf-8") as handle:
            info = json.load(handle)
    except (OSError, ValueError):
        return None
    image = VmImage(
        directory=directory,
        qcow2=os.path.join(directory, f"{IMAGE_NAME}.qcow2"),
        kernel=os.path.join(directory, f"{IMAGE_NAME}.vmlinuz"),
        initrd=os.path.join(directory, f"{IMAGE_NAME}.initrd"),
        tar=os.path.join(directory, f"{IMAGE_NAME}.tar"),
        wheel=os.path.join(directory, info["wheel"]),
        key=info["key"],
        build_seconds=float(info["seconds"]),
    )
    paths = (image.qcow2, image.kernel, image.initrd, image.tar, image.wheel)
    return image if all(os.path.exists(p) for p in paths) else None


def build(root: str | None = None, *, rebuild: bool = False) -> VmImage:
    """Build the guest image into the cache (or return the cached one).

    Args:
        root: Cache directory (default :func:`cache_dir`).
        rebuild: Build again even when an image for these inputs is cached.

    Returns:
        The image.

    Raises:
        ImageError: If a tool is missing or a build step fails.
    """
    root = root or cache_dir()
    os.makedirs(root, exist_ok=True)
    if os.environ.get("TRUSTED_GUEST_VM_REUSE") == "1" and not rebuild:
        # A developer iterating on tests, not on the agent: the newest
        # image, whatever shipped code it was built from.
        built = [i for d in glob.glob(os.path.join(root, "*")) if (i := _image(d))]
        if built:
            return max(built, key=lambda i: os.path.getmtime(i.directory))
    key = input_key()
    target = os.path.join(root, key)
    with cache_lock(root):
        cached = None if rebuild else _image(target)
        if cached is not None:
            os.utime(target)  # most recently used: kept by _prune
            return cached
        check_host()
        image = _build(root, key, target)
        _prune(root)
        return image


def _build(root: str, key: str, target: str) -> VmImage:
    started = time.monotonic()
    work = target + ".work"
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(target, ignore_errors=True)
    wheelhouse = os.path.join(work, "wheels")
    os.makedirs(wheelhouse)
    log = os.path.join(work, "build.log")
    try:
        venv = tools_venv(root)
        wheel = make_wheelhouse(os.path.join(venv, "bin", "python"), wheelhouse)
        dib = os.path.join(venv, "bin", "disk-image-create")
        _run(
            [dib, "-a", "amd64", "-t", ",".join(IMAGE_TYPES), "--no-tmpfs",
             "-o", os.path.join(work, IMAGE_NAME), *ELEMENTS],
            log=log,
            env=_dib_env(root, wheelhouse),
            cwd=work,
        )  # fmt: skip
        shutil.copy(wheel, work)
        with open(os.path.join(work, _BUILD_JSON), "w", encoding="utf-8") as handle:
            json.dump(
                {
                    "key": key,
                    "seconds": round(time.monotonic() - started, 1),
                    "wheel": os.path.basename(wheel),
                    "elements": list(ELEMENTS),
                    "types": list(IMAGE_TYPES),
                    "release": RELEASE,
                    "cmdline": CMDLINE,
                },
                handle,
                indent=1,
            )
        shutil.rmtree(wheelhouse)
        os.rename(work, target)
    except BaseException:
        # Keep the log of a failed build for the error's reader.
        if os.path.exists(log):
            shutil.copy(log, os.path.join(root, f"failed-{key}.log"))
        shutil.rmtree(work, ignore_errors=True)
        raise
    image = _image(target)
    if image is None:
        raise ImageError(f"diskimage-builder left no complete image in {target}")
    return image


def _prune(root: str) -> None:
    """Keep the :data:`KEEP` most recently used images."""
    built = [d for d in glob.glob(os.path.join(root, "*")) if _image(d) is not None]
    built.sort(key=os.path.getmtime, reverse=True)
    for old in built[KEEP:]:
        shutil.rmtree(old, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Command line: ``build [--rebuild] [--cache DIR]``."""
    parser = argparse.ArgumentParser(
        description="Build the guest image with the node agent (diskimage-builder)."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("build", help="build (or reuse) the image; print its path")
    cmd.add_argument("--cache", default=cache_dir(), help="default: %(default)s")
    cmd.add_argument("--rebuild", action="store_true", help="build even if cached")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        image = build(args.cache, rebuild=args.rebuild)
    except ImageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    took = time.monotonic() - started
    for name in ("qcow2", "kernel", "initrd", "tar", "wheel"):
        path = getattr(image, name)
        print(f"{name}: {path} ({os.path.getsize(path) / 2**20:.1f} MiB)")
    print(f"size: {image.size() / 2**20:.1f} MiB (qcow2 + kernel + initrd)")
    print(f"cmdline: {image.cmdline}")
    print(f"build: {image.build_seconds:.0f} s; this run: {took:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
