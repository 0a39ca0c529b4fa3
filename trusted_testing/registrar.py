"""An in-process registrar (the real app, plain HTTP) on a private thread."""

from __future__ import annotations

import asyncio
import os
import random
import tempfile
import threading

from aiohttp import web

from verifier.db import make_engine, upgrade
from verifier.protocol.hosttrust import HostTrustMode
from verifier.registrar import Registrar, make_app


class ThreadRegistrar:
    """The registrar's aiohttp app served on 127.0.0.1:<free port>."""

    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="vtpm-registrar-")
        self.engine = make_engine("sqlite:///" + os.path.join(self._tmp.name, "r.db"))
        upgrade(self.engine)
        # no host is attested by this harness: the host gate is off
        self.registrar = Registrar(self.engine, host_trust=HostTrustMode.OFF)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._runner = web.AppRunner(make_app(self.registrar))
        self._loop.run_until_complete(self._runner.setup())
        # A port below the kernel's ephemeral range: a bind(0) here could take
        # a port that a LocalCluster in another test process has probed and
        # is about to bind.
        for _ in range(100):
            port = random.randrange(10000, 30000)  # noqa: S311
            site = web.TCPSite(self._runner, "127.0.0.1", port)
            try:
                self._loop.run_until_complete(site.start())
            except OSError:
                continue
            self.port = port
            break
        self._ready.set()
        self._loop.run_forever()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        async def stop() -> None:
            await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self.engine.dispose()
        self._tmp.cleanup()
