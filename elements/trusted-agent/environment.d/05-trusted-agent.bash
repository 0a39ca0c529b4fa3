# Defaults of the trusted-agent element (see README.rst). Named 05- so that
# it is read before the bootloader element's defaults.

# cloud-init reads only local seeds: a NoCloud volume or a config drive.
# No datasource probes a metadata server over the network.
export DIB_CLOUD_INIT_DATASOURCES=${DIB_CLOUD_INIT_DATASOURCES:-"NoCloud, ConfigDrive"}

# The kernel's IMA measures with the policy and hash the verifier expects
# (those of the project's measured test guest). console=ttyS0 puts the boot
# and the agent's log on the serial console (Nova's console log).
export DIB_BOOTLOADER_DEFAULT_CMDLINE=${DIB_BOOTLOADER_DEFAULT_CMDLINE:-"nofb nomodeset gfxpayload=text ima_policy=tcb ima_hash=sha256"}

# Where the agent's virtualenv goes.
export DIB_TRUSTED_AGENT_VENV=${DIB_TRUSTED_AGENT_VENV:-/opt/trusted-agent}

# A directory with the project's wheel (trusted_cloud-*.whl) and the wheels
# of its dependencies, made with `pip wheel`: the image installs from it
# without an index. Required.
export DIB_TRUSTED_AGENT_WHEELHOUSE=${DIB_TRUSTED_AGENT_WHEELHOUSE:-}
