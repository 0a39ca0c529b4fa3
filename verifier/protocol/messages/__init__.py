"""Typed wire messages: every JSON object that crosses a process boundary
between our parts (agent, registrar, verifier, tenant tools, vTPM
manager), as a class that validates once in ``from_dict`` and writes
itself back with ``to_dict``. Producers build them, consumers parse them;
no module decodes another's dict by hand.

Each message lives in a module of this package named after its exchange;
import it from there:

* :mod:`.registration` -- agent <-> registrar, and the registrar's record;
* :mod:`.provider` -- vTPM manager <-> registrar (provider EKs);
* :mod:`.enrolment` -- tenant -> verifier (enrol, revoke);
* :mod:`.shares` -- tenant and verifier -> agent (U, V);
* :mod:`.capabilities`, :mod:`.keyservice` -- capabilities and the key
  service;
* :mod:`.abe` -- policy-sealed data (CP-ABE);
* :mod:`.monitor` -- monitor attestation of the verifier host;
* :mod:`.policies` -- stored-policy uploads;
* :mod:`.errors` -- the error body of every service.

Every class is a frozen dataclass that validates in its constructor, has
``from_dict`` (raising only :class:`~verifier.protocol.errors.MalformedError`,
or its :class:`~verifier.protocol.errors.FieldError` naming the field) and
``to_dict``, and compares by value. Requests refuse fields they do not
define; answers ignore them.
"""

__all__: list[str] = []
