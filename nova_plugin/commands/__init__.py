"""The subcommands of ``trusted-tenant`` (:mod:`nova_plugin.cmd`), one
module per group, each command a class that declares its own arguments
and runs itself, as python-openstackclient's commands do:
:mod:`~nova_plugin.commands.nodes` (enrol, status, delete, revoke, list),
:mod:`~nova_plugin.commands.policies` (``policy ...``),
:mod:`~nova_plugin.commands.sealing` (seal, send-sealed),
:mod:`~nova_plugin.commands.integrity` (monitor-trust, monitor-attest) and
:mod:`~nova_plugin.commands.events`; their common shape is in
:mod:`~nova_plugin.commands.base`.
"""

__all__: list[str] = []
