#!/usr/bin/env bash
# Start the broker on the embedded default: data in ./ssb-data, client port 4021 and
# broker port 4022 on 127.0.0.1, no config file. The first run makes a virtual
# environment in .venv and installs ssb there. Extra arguments go to `ssb serve`.
set -euo pipefail
. "$(dirname "$0")/_venv.sh"
ensure_venv ""
exec python -m ssb.broker serve "$@"
