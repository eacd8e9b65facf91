#!/usr/bin/env bash
# Install everything the tests need, then run them all (the README's test command).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check -e '.[test]'
python3 -m ruff check broker protocol client spark_bridge tests bench examples
python3 -m mypy
python3 -m pytest -q -p no:cacheprovider tests "$@"
