"""The guests' network of an emulated compute host: a network namespace the
test makes, and forwards between it and the machine's loopback.

Nova's guests get a real NIC (a tap device libvirt makes and attaches to a
Linux bridge) but every address lives inside :class:`GuestNetwork`'s own
network namespace, never in the machine's: the bridge carries the
gateway (``10.16.0.1/24``), the Neutron stand-in hands each port an
address of that subnet, and Nova writes it to the config drive's
``network_data.json``, which cloud-init renders for systemd-networkd.
The compute host's libvirtd runs in that namespace
(:mod:`trusted_testing.nova.compute_host` ``--netns``), so the taps it
makes for ``<interface type='bridge'>`` are there too; nova-compute and
the control plane stay on the machine's loopback.

The guest sees the host's services at the gateway address; a forwarder
(threads of the test process) joins the two namespaces:

* :meth:`GuestNetwork.forward_in`: ``GATEWAY:PORT`` in the namespace to
  ``127.0.0.1:PORT`` of the machine (the registrar, the verifier's push
  endpoint): the listening socket is made inside the namespace
  (``setns(2)`` on a short-lived thread: a thread's network namespace is
  its own, and a socket stays in the namespace it was made in);
* :meth:`GuestNetwork.forward_out`: a free ``127.0.0.1`` port of the
  machine to ``GUEST:PORT`` in the namespace (the agent's port, in pull
  mode): the outgoing socket is made inside the namespace.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import subprocess
import threading
import uuid as uuid_mod
from collections.abc import Callable

__all__ = ["GuestNetwork"]

_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _ip(*argv: str) -> None:
    done = subprocess.run(
        ["ip", *argv], capture_output=True, text=True, timeout=30, check=False
    )
    if done.returncode:
        raise RuntimeError(f"ip {' '.join(argv)}: {done.stderr.strip()}")


def _in_netns(path: str, make: Callable[[], socket.socket]) -> socket.socket:
    """``make()`` run on a thread that entered the namespace at ``path``."""
    result: list[socket.socket | BaseException] = []

    def run() -> None:
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                if _libc.setns(fd, _CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns {path}: {os.strerror(err)}")
            finally:
                os.close(fd)
            result.append(make())
        except BaseException as exc:  # handed to the caller
            result.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join()
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


class _Forward:
    """Accepts on ``listener``; joins each connection to ``connect()``."""

    def __init__(
        self, listener: socket.socket, connect: Callable[[], socket.socket]
    ) -> None:
        self.listener = listener
        self._connect = connect
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._join, args=(client,), daemon=True).start()

    def _join(self, client: socket.socket) -> None:
        try:
            upstream = self._connect()
        except OSError:
            client.close()
            return
        with self._lock:
            self._open.update((client, upstream))
        other = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
        other.start()
        _pump(client, upstream)
        other.join()
        with self._lock:
            self._open.difference_update((client, upstream))
        client.close()
        upstream.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


class GuestNetwork:
    """A network namespace with a bridge for guests (see the module doc).

    Attributes:
        name: the namespace (``ip netns``); its file is :attr:`path`.
        bridge: the bridge in it that guests' taps join.
        gateway: the bridge's address: the host's services as guests see
            them.
        prefix: the subnet's prefix length.
    """

    SUBNET = "10.16.0"

    def __init__(self) -> None:
        self.name = f"trusted-nova-{uuid_mod.uuid4().hex[:8]}"
        self.bridge = "br-trusted"
        self.gateway = f"{self.SUBNET}.1"
        self.prefix = 24
        self.cidr = f"{self.SUBNET}.0/{self.prefix}"
        self._forwards: list[_Forward] = []
        self._made = False
        self._stopping = threading.Event()
        self._keeper: threading.Thread | None = None

    @property
    def path(self) -> str:
        return f"/run/netns/{self.name}"

    def address(self, index: int) -> str:
        """The ``index``-th guest address (2..254)."""
        if not 2 <= index <= 254:
            raise ValueError(f"no guest address {index} in {self.cidr}")
        return f"{self.SUBNET}.{index}"

    def start(self) -> None:
        _ip("netns", "add", self.name)
        self._made = True
        try:
            _ip("-n", self.name, "link", "set", "lo", "up")
            _ip(
                "-n", self.name, "link", "add", self.bridge, "type", "bridge",
                "forward_delay", "0", "stp_state", "0",
            )  # fmt: skip
            _ip("-n", self.name, "addr", "add", f"{self.gateway}/{self.prefix}",
                "dev", self.bridge)  # fmt: skip
            _ip("-n", self.name, "link", "set", self.bridge, "up")
        except BaseException:
            self.stop()
            raise
        self._keeper = threading.Thread(target=self._keep_taps, daemon=True)
        self._keeper.start()

    def _keep_taps(self) -> None:
        """Attach each new tap (Nova makes one per VIF at every plug: boot,
        hard reboot, start, resize) to the bridge."""
        while not self._stopping.wait(0.3):
            try:
                for line in self.links().splitlines():
                    name = line.split(":")[1].strip().split("@")[0]
                    if name.startswith("tap") and " master " not in line:
                        _ip("-n", self.name, "link", "set", name, "master", self.bridge)
            except (RuntimeError, subprocess.SubprocessError, OSError, IndexError):
                continue  # a tap that came or went meanwhile: next round

    def stop(self) -> None:
        self._stopping.set()
        if self._keeper is not None:
            self._keeper.join(10)
        for forward in self._forwards:
            forward.close()
        self._forwards.clear()
        if self._made:
            _ip("netns", "del", self.name)
            self._made = False

    def links(self) -> str:
        """``ip -o link`` inside the namespace (the guests' taps)."""
        done = subprocess.run(
            ["ip", "-n", self.name, "-o", "link"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return done.stdout

    def forward_in(self, port: int) -> None:
        """Guests reach ``127.0.0.1:port`` of the machine at
        ``gateway:port``."""

        def listen() -> socket.socket:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.gateway, port))
            sock.listen(64)
            return sock

        def connect() -> socket.socket:
            return socket.create_connection(("127.0.0.1", port), timeout=30)

        self._forwards.append(_Forward(_in_netns(self.path, listen), connect))

    def forward_out(self, address: str, port: int) -> int:
        """The machine reaches ``address:port`` in the namespace at
        ``127.0.0.1`` on the returned (free) port."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)

        def connect() -> socket.socket:
            def make() -> socket.socket:
                return socket.socket(socket.AF_INET, socket.SOCK_STREAM)

            sock = _in_netns(self.path, make)
            sock.settimeout(30)
            try:
                sock.connect((address, port))
            except OSError:
                sock.close()
                raise
            sock.settimeout(None)
            return sock

        self._forwards.append(_Forward(listener, connect))
        return int(listener.getsockname()[1])
