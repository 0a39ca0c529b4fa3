"""Nova's notifications over real RabbitMQ to the ``trusted-nova-listener``
process; the case runs in a process of its own (see :mod:`_isolated`)."""

from __future__ import annotations

import os

from trusted_testing.nova import isolated as _isolated

_CASES = "nova_plugin.tests.functional.nova_rabbit_cases"
_PATH = os.path.join(os.path.dirname(__file__), "nova_rabbit_cases.py")

NovaRabbitListenerTest = _isolated.wrapper(_CASES, _PATH)
NovaRabbitListenerTest.__name__ = "NovaRabbitListenerTest"
NovaRabbitListenerTest.__qualname__ = "NovaRabbitListenerTest"
NovaRabbitListenerTest.__module__ = __name__
