#!/bin/bash
# Installs what `make demo` and `make test` need on a fresh Debian machine:
# Debian packages (swtpm, TSS headers, a C toolchain for wheels that build
# from source, shellcheck for the DevStack plugin) and a virtualenv in .venv
# with the project in develop mode with every extra of setup.cfg (each role
# and each optional driver: the tests exercise them all), the test tools,
# Sphinx (doc/requirements.txt) and reno.
# Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PKGS=$(sed -e 's/#.*//' tools/apt-packages.txt | xargs)
missing=""
for pkg in $APT_PKGS; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
        || missing="$missing $pkg"
done
if [ -n "$missing" ]; then
    echo "==> installing Debian packages:$missing"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    # Another installer may hold the dpkg lock: wait for it rather than fail.
    apt_opts="-oDPkg::Lock::Timeout=900"
    $SUDO apt-get "$apt_opts" update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get "$apt_opts" install -y -qq \
        $missing >/dev/null
fi

PYTHON="${PYTHON:-python3}"
stamp=".venv/.installed"
inputs="requirements.txt test-requirements.txt doc/requirements.txt setup.cfg tools/apt-packages.txt tools/install-deps.sh"
if [ -f "$stamp" ] && [ -z "$(find $inputs -newer "$stamp")" ] \
        && .venv/bin/python -c "import verifier, tpm2_pytss, pymysql, sphinx, reno" 2>/dev/null; then
    exit 0
fi
# Every extra of setup.cfg: agent,client,server,hooks,vtpm,abe,messaging,...
EXTRAS=$("$PYTHON" -c 'import configparser
c = configparser.ConfigParser()
c.read("setup.cfg")
print(",".join(c["extras"]))')
if [ ! -x .venv/bin/python ]; then
    echo "==> creating the virtualenv in .venv"
    "$PYTHON" -m venv .venv
fi
echo "==> installing Python packages (tpm2-pytss may build from source once)"
.venv/bin/pip install -q --upgrade pip wheel setuptools
.venv/bin/pip install -q -r test-requirements.txt -r doc/requirements.txt \
    -e ".[$EXTRAS]"
touch "$stamp"
