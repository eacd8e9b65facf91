#!/usr/bin/env bash
# Start the broker on the embedded default: data in ./ssb-data, client port 4021 and
# broker port 4022 on 127.0.0.1, no config file. Installs the package first if needed.
# Extra arguments go to `ssb serve` (see `ssb serve --help`).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
if ! python3 -c "import broker, msgpack" 2>/dev/null; then
    python3 -m pip install --quiet --disable-pip-version-check -e "$here"
fi
exec python3 -m broker serve "$@"
