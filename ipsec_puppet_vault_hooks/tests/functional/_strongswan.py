"""Real strongSwan charons in network namespaces, for the ipsec action tests.

Each :class:`Charon` runs ``/usr/lib/ipsec/charon`` in its own network
namespace and its own mount namespace, where a private directory is bound
over ``/run`` (charon's pid file is ``/run/charon.pid``, so several charons
could not share one). ESP is done in userspace by the kernel-libipsec
plugin over a TUN device, as the test kernel has no ESP support. Every
process is stopped by PID and every namespace deleted by name, even when
start-up fails half way. Set ``TC_IPSEC_KEEP=1`` to keep the work
directory (configs and charon logs) for debugging.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import Any

import vici

from verifier.testing.cluster import die_with_parent

CHARON = "/usr/lib/ipsec/charon"

_PLUGINS = (
    "random nonce openssl kdf pem pkcs1 pkcs8 x509 revocation constraints pubkey "
    "kernel-libipsec kernel-netlink socket-default vici"
)

_CONF = """\
charon {{
    load = {plugins}
    retransmit_tries = 2
    retransmit_timeout = 1.0
    plugins {{
        vici {{
            socket = unix://{vici}
        }}
    }}
    filelog {{
        test {{
            path = {log}
            time_format = %T
            default = 1
            cfg = 2
            append = no
            flush_line = yes
        }}
    }}
}}
"""


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command, capturing its output; raise with that output on failure."""
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)} exited {result.returncode}: {result.stderr.strip()}"
        )
    return result


class Charon:
    """One charon daemon in the network namespace ``netns``.

    Args:
        netns: the (existing) network namespace.
        workdir: a private directory for its config, log, /run and socket.
    """

    def __init__(self, netns: str, workdir: str) -> None:
        self.netns = netns
        self.workdir = workdir
        self.vici_socket = os.path.join(workdir, "charon.vici")
        self.log = os.path.join(workdir, "charon.log")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> None:
        run_dir = os.path.join(self.workdir, "run")
        os.makedirs(run_dir, exist_ok=True)
        conf = os.path.join(self.workdir, "strongswan.conf")
        with open(conf, "w", encoding="utf-8") as f:
            f.write(_CONF.format(plugins=_PLUGINS, vici=self.vici_socket, log=self.log))
        script = f"mount --bind {run_dir} /run && exec {CHARON}"
        argv = ["ip", "netns", "exec", self.netns, "unshare", "--mount"]
        argv += ["--propagation", "private", "sh", "-c", script]
        with open(os.path.join(self.workdir, "stderr.log"), "wb") as err:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=err,
                env={**os.environ, "STRONGSWAN_CONF": conf},
                preexec_fn=die_with_parent,  # noqa: PLW1509
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"charon in {self.netns} exited: {self.tail()}")
            with contextlib.suppress(OSError), self.session():
                return
            time.sleep(0.05)
        raise RuntimeError(f"charon in {self.netns} never opened vici: {self.tail()}")

    def tail(self, lines: int = 20) -> str:
        texts = []
        for name in ("stderr.log", "charon.log"):
            with contextlib.suppress(OSError):
                with open(os.path.join(self.workdir, name), errors="replace") as f:
                    texts.append("".join(f.readlines()[-lines:]))
        return "\n".join(texts)

    def log_text(self) -> str:
        with open(self.log, encoding="utf-8", errors="replace") as f:
            return f.read()

    @contextlib.contextmanager
    def session(self) -> Iterator[vici.Session]:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(30)
            sock.connect(self.vici_socket)
            yield vici.Session(sock)
        finally:
            sock.close()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    # -- vici helpers used by the tests --------------------------------

    def load_identity(self, ca_pem: bytes, cert_pem: bytes, key_pem: bytes) -> None:
        """Trust ``ca_pem`` and load this end's certificate and key."""
        with self.session() as s:
            s.load_cert({"type": "x509", "flag": "ca", "data": ca_pem})
            s.load_cert({"type": "x509", "flag": "none", "data": cert_pem})
            s.load_key({"type": "any", "data": key_pem})

    def conns(self) -> set[str]:
        with self.session() as s:
            return {_text(n) for n in s.get_conns().get("conns", [])}

    def ike_sas(self, ike: str | None = None) -> dict[str, dict[str, Any]]:
        """IKE SAs (optionally of connection ``ike``) by unique id."""
        with self.session() as s:
            return {
                _text(sa["uniqueid"]): sa
                for entry in s.list_sas({"ike": ike} if ike else {})
                for sa in entry.values()
            }

    def initiate(self, name: str, timeout_ms: int = 15000) -> None:
        """Bring up CHILD_SA ``name`` of connection ``name``.

        Raises:
            vici.exception.CommandException: if it cannot be established.
        """
        with self.session() as s:
            for _log in s.initiate(
                {"ike": name, "child": name, "timeout": str(timeout_ms)}
            ):
                pass


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Lab:
    """A hub and ``spokes`` nodes, each its own network namespace with a
    charon, the hub linked to each node by a veth pair.

    Addresses: hub–node *i* link 10.10.*i*.1 (hub) and 10.10.*i*.2 (node);
    inner (tunnelled) addresses 10.99.0.1 (hub) and 10.99.0.(*i*+1) (node
    *i*), on ``lo``. Namespace names are unique per lab, so labs of
    concurrent test runs never meet.
    """

    def __init__(self, spokes: int = 2) -> None:
        tag = uuid.uuid4().hex[:8]
        self.workdir = tempfile.mkdtemp(prefix="tc-ipsec-")
        self.netns = {"hub": f"tc-ipsec-{tag}-hub"}
        for i in range(1, spokes + 1):
            self.netns[f"node{i}"] = f"tc-ipsec-{tag}-n{i}"
        self.charons: dict[str, Charon] = {}
        self._created: list[str] = []

    def hub_outer(self, i: int) -> str:
        return f"10.10.{i}.1"

    def node_outer(self, i: int) -> str:
        return f"10.10.{i}.2"

    def node_inner(self, i: int) -> str:
        return f"10.99.0.{i + 1}"

    HUB_INNER = "10.99.0.1"

    def start(self) -> None:
        """Create the namespaces and links and start every charon; on any
        failure, undo what was done and raise."""
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        for netns in self.netns.values():
            run("ip", "netns", "add", netns)
            self._created.append(netns)
            run("ip", "-n", netns, "link", "set", "lo", "up")
        hub = self.netns["hub"]
        run("ip", "-n", hub, "addr", "add", f"{self.HUB_INNER}/32", "dev", "lo")
        for i in range(1, len(self.netns)):
            node = self.netns[f"node{i}"]
            run(
                "ip", "link", "add", "name", f"to-node{i}", "netns", hub,
                "type", "veth", "peer", "name", "to-hub", "netns", node,
            )  # fmt: skip
            run("ip", "-n", hub, "addr", "add", f"{self.hub_outer(i)}/24",
                "dev", f"to-node{i}")  # fmt: skip
            run("ip", "-n", node, "addr", "add", f"{self.node_outer(i)}/24",
                "dev", "to-hub")  # fmt: skip
            run("ip", "-n", node, "addr", "add", f"{self.node_inner(i)}/32",
                "dev", "lo")  # fmt: skip
            run("ip", "-n", hub, "link", "set", f"to-node{i}", "up")
            run("ip", "-n", node, "link", "set", "to-hub", "up")
        for name, netns in self.netns.items():
            workdir = os.path.join(self.workdir, name)
            os.makedirs(workdir)
            self.charons[name] = Charon(netns, workdir)
            self.charons[name].start()

    def ping(self, i: int) -> bool:
        """Whether node ``i`` gets an answer from the hub's inner address,
        sent from its own inner address (so only through the tunnel)."""
        result = run(
            "ip", "netns", "exec", self.netns[f"node{i}"], "ping", "-c", "1",
            "-W", "2", "-I", self.node_inner(i), self.HUB_INNER, check=False,
        )  # fmt: skip
        return result.returncode == 0

    def swanctl(self, name: str, *args: str) -> subprocess.CompletedProcess[str]:
        """Run swanctl against charon ``name``'s vici socket."""
        uri = f"unix://{self.charons[name].vici_socket}"
        return run("swanctl", *args, "--uri", uri)

    def close(self) -> None:
        """Stop every charon, delete every namespace and the work dir."""
        for charon in self.charons.values():
            charon.stop()
        for netns in self._created:
            run("ip", "netns", "del", netns, check=False)
        self._created.clear()
        if not os.environ.get("TC_IPSEC_KEEP"):
            shutil.rmtree(self.workdir, ignore_errors=True)
