"""Typed wire messages: every JSON object that crosses a process boundary
between our parts (agent, registrar, verifier, tenant tools, vTPM
manager), as a class that validates once in ``from_dict`` and writes
itself back with ``to_dict``. Producers build them, consumers parse them;
no module decodes another's dict by hand.

Each message lives in a module of this package named after its exchange;
import it from there.
"""

__all__: list[str] = []
