"""The aiohttp applications of the services (the shared helpers are in
:mod:`verifier.common.web`)."""

__all__: list[str] = []
