"""The shared plumbing: what every deployable role of the project uses
besides the protocol core, and nothing that needs a database, a message
bus or libvirt.

- :mod:`verifier.common.errors`: the plumbing's errors (request refused,
  transport failed, TPM failed);
- :mod:`verifier.common.web`: JSON error bodies, bounded request reading
  and client-certificate roles for the aiohttp servers;
- :mod:`verifier.common.tls`: TLS contexts, pinning, self-signed keys;
- :mod:`verifier.common.extras`: which optional extra a feature needs,
  and the one-line error when it is not installed;
- :mod:`verifier.common.http`: the one HTTP client (async keep-alive and
  blocking), whose every failure is a :class:`~verifier.common.errors.TransportError`;
- :mod:`verifier.common.agent_client`: requests to node agents, each
  agent's certificate pinned;
- :mod:`verifier.common.plugins`: the extension points other packages
  implement (revocation notifiers, Nova instance hooks);
- :mod:`verifier.common.bootdisk`: a whole-disk image's Secure Boot chain
  (shim, GRUB, what GRUB's menu boots), read in pure Python by
  :mod:`~verifier.common.diskimage` (raw, qcow2, GPT),
  :mod:`~verifier.common.fatfs`, :mod:`~verifier.common.ext4fs`,
  :mod:`~verifier.common.grubcfg`; :mod:`~verifier.common.ovmfvars` reads
  an OVMF variable store; every defect is a ``DiskImageError``;
- :mod:`verifier.common.tpm` (needs ``tpm2-pytss``): a TPM device or
  swtpm, for the agent, the vTPM manager and host-TPM monitoring.

Dependency direction: :mod:`verifier.protocol` <- here <- every service,
the agent, the tenant tools, the hooks and the vTPM manager.
"""

__all__: list[str] = []
