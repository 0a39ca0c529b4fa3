#!/bin/bash
# Build (or reuse) the measured test guest: a Debian kernel fetched with
# `apt-get download` (never installed on the host), a busybox initramfs and
# a squashfs of measured content, cached in ${TRUSTED_GUEST_CACHE:-~/.cache/
# trusted-cloud/guest}. Pass --rebuild to build again. See README.rst here.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-.venv/bin/python}"
exec "$PYTHON" -m trusted_testing.guest_image "$@"
