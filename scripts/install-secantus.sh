#!/usr/bin/env bash
# Installs what the tests run beside the crate, each part only when it is missing:
# - SecantusDB (the MongoDB wire-protocol server the integration tests run as shards) and
#   pymongo (a client of `reshard front` in tests/front_wire.rs) into <repo>/.venv;
# - the Node MongoDB driver and mongosh (clients of `reshard front`) into
#   <repo>/tests/clients/node_modules, from tests/clients/package-lock.json (`npm ci`).
set -euo pipefail

SECANTUS_VERSION="0.7.0b3" # a pre-release: keep it pinned
PYMONGO_VERSION="4.20.1"   # the version SecantusDB itself brings
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$repo/.venv"
clients="$repo/tests/clients"

if ! command -v python3 >/dev/null 2>&1; then
    echo "install-secantus: python3 is required (apt-get install python3 python3-venv)" >&2
    exit 1
fi

if [[ ! -x "$venv/bin/pip" ]]; then
    echo "install-secantus: creating virtualenv $venv"
    if ! python3 -m venv "$venv"; then
        echo "install-secantus: 'python3 -m venv' failed (apt-get install python3-venv?)" >&2
        exit 1
    fi
fi

if [[ -x "$venv/bin/secantusd-py" ]]; then
    echo "install-secantus: $venv/bin/secantusd-py already present"
else
    echo "install-secantus: installing SecantusDB==$SECANTUS_VERSION into $venv"
    "$venv/bin/pip" install --disable-pip-version-check --quiet "SecantusDB==$SECANTUS_VERSION"
    if [[ ! -x "$venv/bin/secantusd-py" ]]; then
        echo "install-secantus: SecantusDB installed but $venv/bin/secantusd-py is missing" >&2
        exit 1
    fi
fi

if "$venv/bin/python" -c "import pymongo, sys; sys.exit(pymongo.version != '$PYMONGO_VERSION')" 2>/dev/null; then
    echo "install-secantus: pymongo $PYMONGO_VERSION already present"
else
    echo "install-secantus: installing pymongo==$PYMONGO_VERSION into $venv"
    "$venv/bin/pip" install --disable-pip-version-check --quiet "pymongo==$PYMONGO_VERSION"
fi

if [[ -x "$clients/node_modules/.bin/mongosh" && -d "$clients/node_modules/mongodb" ]]; then
    echo "install-secantus: the Node clients are already present in $clients/node_modules"
else
    if ! command -v npm >/dev/null 2>&1; then
        echo "install-secantus: npm is required for the Node clients (Node 20 or later)" >&2
        exit 1
    fi
    echo "install-secantus: installing the Node driver and mongosh into $clients/node_modules"
    # Install scripts only build optional native add-ons (Kerberos, OS DNS) the tests do not use.
    npm ci --prefix "$clients" --ignore-scripts --no-audit --no-fund --loglevel=error
fi
echo "install-secantus: ready: $venv/bin/secantusd-py, pymongo, the Node driver and mongosh"
