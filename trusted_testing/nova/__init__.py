"""Nova 34 for the integration tests: the multi-process deployment, its
Glance and Neutron stand-ins, the WSGI runner, and the isolated-process
test runner."""
