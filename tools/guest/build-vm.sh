#!/bin/bash
# Build (or reuse) the operator's guest image with diskimage-builder and the
# trusted-agent element (elements/): Debian 12, its 6.1 kernel with IMA,
# cloud-init (NoCloud, ConfigDrive) and the agent from the project's wheel.
# Cached in ${TRUSTED_GUEST_VM_CACHE:-~/.cache/trusted-cloud/guest-vm}; pass
# --rebuild to build again. Needs root. See doc/source/admin/guest-image.rst.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-.venv/bin/python}"
exec "$PYTHON" -m trusted_testing.guest_vm build "$@"
