"""Over-long request lines and headers against the real processes.

A registrar, a verifier with its push port, and a node agent on swtpm
(:class:`~trusted_testing.cluster.LocalCluster`), each sent a 60 kB URL
and a 20 kB header over mTLS: each answers a JSON 400 naming the problem
without echoing the line (which carries what could be a token), and its
log gets a line saying so and no traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import tempfile

import testtools

from trusted_testing.cluster import LocalCluster, free_port

_SECRET = b"gAAAAAB-a-token-that-must-not-be-logged-"


class OverlongRequestTest(testtools.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.tmp = tempfile.mkdtemp(prefix="trusted-overlong-")
        cls.cluster = LocalCluster(
            os.path.join(cls.tmp, "cluster"),
            nodes=1,
            verifier_sections={"push": {"port": free_port()}},
        )
        try:
            cls.cluster.start()
        except Exception:
            cls.cluster.stop()
            shutil.rmtree(cls.tmp, ignore_errors=True)
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        cls.cluster.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)
        super().tearDownClass()

    def _servers(self) -> dict[str, tuple[int, list[str]]]:
        """Server name -> (port, its log files)."""
        work = self.cluster.workdir
        node = self.cluster.nodes[0]
        verifier_logs = [os.path.join(work, f"verifier.{x}") for x in ("log", "out")]
        return {
            "registrar": (
                self.cluster.registrar_port,
                [os.path.join(work, f"registrar.{x}") for x in ("log", "out")],
            ),
            "verifier": (self.cluster.verifier_port, verifier_logs),
            "push port": (self.cluster.push_ports[0], verifier_logs),
            "node agent": (node.port, [node.log]),
        }

    def _send(self, port: int, raw: bytes) -> tuple[int, bytes]:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # the agent's certificate is pinned
        pki = self.cluster.pki
        ctx.load_cert_chain(
            os.path.join(pki, "verifier.pem"), os.path.join(pki, "verifier-key.pem")
        )
        with socket.create_connection(("127.0.0.1", port), 10) as sock:
            with ctx.wrap_socket(sock) as tls:
                tls.sendall(raw)
                answer = b""
                while chunk := tls.recv(65536):
                    answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        return int(head.split()[1]), body

    @staticmethod
    def _read(paths: list[str]) -> str:
        text = ""
        for path in paths:
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    text += f.read()
        return text

    def _assert_refused_in_json(self, raw: bytes) -> None:
        for name, (port, logs) in self._servers().items():
            before = self._read(logs)
            status, body = self._send(port, raw)
            self.assertEqual(400, status, f"{name}: {body!r}")
            error = json.loads(body)["error"]
            self.assertEqual("line_too_long", error["code"], name)
            self.assertNotIn(_SECRET, body, name)
            after = self._read(logs)[len(before) :]
            self.assertNotIn("Traceback", after, name)
            self.assertNotIn(_SECRET.decode(), after, name)
            self.assertIn("line_too_long", after, name)

    def test_60kb_url_gets_json_400_from_every_server(self) -> None:
        path = b"/v1/nodes?x=" + _SECRET + b"a" * 60_000
        self._assert_refused_in_json(b"GET " + path + b" HTTP/1.1\r\nHost: h\r\n\r\n")

    def test_20kb_header_gets_json_400_from_every_server(self) -> None:
        header = b"X-Auth-Token: " + _SECRET + b"b" * 20_000
        raw = b"GET /v1/nodes HTTP/1.1\r\nHost: h\r\n" + header + b"\r\n\r\n"
        self._assert_refused_in_json(raw)
