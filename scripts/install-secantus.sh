#!/usr/bin/env bash
# Installs SecantusDB (the MongoDB wire-protocol server the integration tests run as
# shards) into <repo>/.venv. Idempotent: does nothing when .venv/bin/secantusd-py exists.
set -euo pipefail

SECANTUS_VERSION="0.7.0b3" # a pre-release: keep it pinned
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$repo/.venv"

if [[ -x "$venv/bin/secantusd-py" ]]; then
    echo "install-secantus: $venv/bin/secantusd-py already present"
    exit 0
fi

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

echo "install-secantus: installing SecantusDB==$SECANTUS_VERSION into $venv"
"$venv/bin/pip" install --disable-pip-version-check --quiet "SecantusDB==$SECANTUS_VERSION"

if [[ ! -x "$venv/bin/secantusd-py" ]]; then
    echo "install-secantus: SecantusDB installed but $venv/bin/secantusd-py is missing" >&2
    exit 1
fi
echo "install-secantus: ready: $venv/bin/secantusd-py"
