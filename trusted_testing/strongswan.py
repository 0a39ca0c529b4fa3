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
import json
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
from cryptography import x509

from ipsec_puppet_vault_hooks._ipsec.peers import render_swanctl
from trusted_testing.cluster import die_with_parent
from verifier.ca import CertificateAuthority

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

    def ping(self, i: int, wait: int = 3) -> bool:
        """Whether node ``i`` gets an answer from the hub's inner address
        within ``wait`` seconds, sent from its own inner address (so only
        through the tunnel)."""
        result = run(
            "ip", "netns", "exec", self.netns[f"node{i}"], "ping", "-c", "1",
            "-W", str(wait), "-I", self.node_inner(i), self.HUB_INNER,
            check=False,
        )  # fmt: skip
        return result.returncode == 0

    def swanctl(self, name: str, *args: str) -> subprocess.CompletedProcess[str]:
        """Run swanctl against charon ``name``'s vici socket, with its
        ``swanctl`` directory (``<workdir>/swanctl``) as SWANCTL_DIR."""
        charon = self.charons[name]
        argv = ["swanctl", *args, "--uri", f"unix://{charon.vici_socket}"]
        env = {**os.environ, "SWANCTL_DIR": os.path.join(charon.workdir, "swanctl")}
        result = subprocess.run(argv, capture_output=True, text=True, env=env)
        if result.returncode != 0:
            raise RuntimeError(
                f"{' '.join(argv)} failed: "
                f"{result.stdout[-2000:]}{result.stderr[-2000:]}"
            )
        return result

    def close(self) -> None:
        """Stop every charon, delete every namespace and the work dir."""
        for charon in self.charons.values():
            charon.stop()
        for netns in self._created:
            run("ip", "netns", "del", netns, check=False)
        self._created.clear()
        if not os.environ.get("TC_IPSEC_KEEP"):
            shutil.rmtree(self.workdir, ignore_errors=True)


class Site:
    """What provisioning sets up around a :class:`Lab`: a CA (our software
    CA) issuing the hub's certificate and each node's (CN = node UUID),
    the hub's swanctl directory (credentials, ``x509crl/`` and
    ``conf.d/trusted-peers.conf`` rendered from the peer mappings), the
    peer mappings in ``peers_dir``, and each node's connection to the hub
    (loaded over vici).
    """

    CONF_NAME = "trusted-peers.conf"
    CRL_NAME = "trusted-cloud.crl"

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self.pki = os.path.join(lab.workdir, "pki")
        self.peers_dir = os.path.join(lab.workdir, "peers")
        self.swanctl_dir = os.path.join(lab.charons["hub"].workdir, "swanctl")
        for sub in ("x509", "x509ca", "x509crl", "pkcs8", "conf.d"):
            os.makedirs(os.path.join(self.swanctl_dir, sub))
        os.makedirs(self.peers_dir)
        with open(os.path.join(self.swanctl_dir, "swanctl.conf"), "w") as f:
            f.write("include conf.d/*.conf\n")
        self.ca = CertificateAuthority.create(self.pki, "Trusted Cloud IPsec test CA")
        self._write("x509ca/ca.pem", self.ca.cert_pem)
        key, cert = self.ca.issue("hub", [])
        self._write("x509/hub.pem", cert)
        self._write("pkcs8/hub.pem", key)
        self.uuids: dict[int, str] = {}
        self.serials: dict[int, int] = {}
        self.hub_conns: dict[int, dict[str, Any]] = {}
        for i in range(1, len(lab.netns)):
            self._add_node(i)
        # Outside conf.d (so --load-all skips it), but in the swanctl
        # directory: swanctl resolves certificate names relative to it.
        self.initial_conf = os.path.join(self.swanctl_dir, "initial.conf")
        with open(self.initial_conf, "w") as f:
            f.write(render_swanctl(self.hub_conns_named()))
        shutil.copy(self.initial_conf, self.swanctl_conf)

    @property
    def crl_file(self) -> str:
        return os.path.join(self.swanctl_dir, "x509crl", self.CRL_NAME)

    @property
    def swanctl_conf(self) -> str:
        return os.path.join(self.swanctl_dir, "conf.d", self.CONF_NAME)

    def _write(self, name: str, data: bytes) -> None:
        with open(os.path.join(self.swanctl_dir, name), "wb") as f:
            f.write(data)

    def hub_conns_named(self) -> list[tuple[str, dict[str, Any]]]:
        return [(f"node{i}", conn) for i, conn in self.hub_conns.items()]

    def _add_node(self, i: int) -> None:
        lab = self.lab
        node_uuid = self.uuids[i] = str(uuid.uuid4())
        key, cert = self.ca.issue(node_uuid, [])
        self.serials[i] = x509.load_pem_x509_certificate(cert).serial_number
        with open(os.path.join(self.peers_dir, f"{node_uuid}.pem"), "wb") as f:
            f.write(cert)
        self.hub_conns[i] = {
            "version": 2,
            "local_addrs": lab.hub_outer(i),
            "remote_addrs": lab.node_outer(i),
            "encap": True,
            "local": {"auth": "pubkey", "certs": "hub.pem", "id": "CN=hub"},
            "remote": {"auth": "pubkey", "id": f"CN={node_uuid}"},
            "children": {
                f"node{i}": {
                    "local_ts": f"{lab.HUB_INNER}/32",
                    "remote_ts": f"{lab.node_inner(i)}/32",
                }
            },
        }
        mapping = {
            "connection": f"node{i}",
            "certificate": f"{node_uuid}.pem",
            "swanctl": self.hub_conns[i],
        }
        with open(os.path.join(self.peers_dir, f"{node_uuid}.json"), "w") as f:
            json.dump(mapping, f)
        node = lab.charons[f"node{i}"]
        node.load_identity(self.ca.cert_pem, cert, key)
        conn = {
            "version": "2",
            "local_addrs": [lab.node_outer(i)],
            "remote_addrs": [lab.hub_outer(i)],
            "encap": "yes",
            "local": {"auth": "pubkey", "certs": [cert], "id": f"CN={node_uuid}"},
            "remote": {"auth": "pubkey", "id": "CN=hub"},
            "children": {
                "hub": {
                    "local_ts": [f"{lab.node_inner(i)}/32"],
                    "remote_ts": [f"{lab.HUB_INNER}/32"],
                }
            },
        }
        with node.session() as s:
            s.load_conn({"hub": conn})

    def load_hub(self) -> None:
        """``swanctl --load-all`` on the hub, as at boot."""
        self.lab.swanctl("hub", "--load-all")

    def action_settings(self) -> dict[str, Any]:
        """``[action_ipsec]`` options for the hub."""
        return {
            "vici_socket": self.lab.charons["hub"].vici_socket,
            "peers_dir": self.peers_dir,
            "ca_cert": os.path.join(self.pki, "ca.pem"),
            "ca_key": os.path.join(self.pki, "ca-key.pem"),
            "crl_file": self.crl_file,
            "swanctl_conf": self.swanctl_conf,
            "terminate_timeout": 3000,
        }
