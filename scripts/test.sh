#!/usr/bin/env bash
# Install everything the tests need into .venv, then run them all (the README's
# test command). The Spark tests need Java 17 or 21 on the PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_venv.sh
ensure_venv "[test]"
python -m ruff check broker protocol client spark_bridge tests bench examples
bash scripts/typecheck.sh
python -m pytest -q -p no:cacheprovider tests "$@"
