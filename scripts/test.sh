#!/usr/bin/env bash
# Install everything the tests need into .venv, then run them all (the README's
# test command). The Spark tests need Java 17 or 21 ($JAVA_HOME/bin/java, or java on
# the PATH): as root with apt-get it is installed, otherwise its absence stops here.
#
# --fast (first argument): the developer's loop. The same checks, then only the unit,
# wire and smoke tests, which need neither Java nor a browser: under a minute.
# Other arguments go to pytest (e.g. -m "not slow", -k NAME).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_venv.sh
fast=false
if [ "${1:-}" = "--fast" ]; then
    fast=true
    shift
fi

has_java() {
    if [ -n "${JAVA_HOME:-}" ]; then [ -x "$JAVA_HOME/bin/java" ]; else command -v java >/dev/null 2>&1; fi
}
if ! $fast && ! has_java; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "ssb: the Spark tests need Java 17 or 21; installing openjdk-17-jre-headless" >&2
        apt-get install -y -qq openjdk-17-jre-headless >/dev/null 2>&1 \
            || { apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless; } >/dev/null 2>&1 \
            || true
    fi
    if ! has_java; then
        echo "ssb: the Spark tests need Java 17 or 21 and no java was found (JAVA_HOME or the" \
             "PATH); on Debian/Ubuntu: sudo apt-get install openjdk-17-jre-headless" >&2
        exit 1
    fi
fi
# The dashboard tests drive Debian's Chromium (the `chromium` package), never a
# downloaded browser: as root with apt-get it is installed, otherwise its absence stops here.
has_chromium() { command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; }
if ! $fast && ! has_chromium; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "ssb: the dashboard tests need Chromium; installing chromium" >&2
        apt-get install -y -qq chromium >/dev/null 2>&1 \
            || { apt-get update -qq && apt-get install -y -qq chromium; } >/dev/null 2>&1 \
            || true
    fi
    if ! has_chromium; then
        echo "ssb: the dashboard tests need Chromium and none was found on the PATH;" \
             "on Debian/Ubuntu: sudo apt-get install chromium" >&2
        exit 1
    fi
fi
# The PostgreSQL store's tests start a server of Debian's `postgresql` package (initdb,
# pg_ctl): as root with apt-get it is installed, otherwise its absence stops here.
has_postgresql() { command -v initdb >/dev/null 2>&1 || compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; }
if ! has_postgresql; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "ssb: the PostgreSQL store's tests need PostgreSQL; installing postgresql" >&2
        apt-get install -y -qq postgresql >/dev/null 2>&1 \
            || { apt-get update -qq && apt-get install -y -qq postgresql; } >/dev/null 2>&1 \
            || true
    fi
    if ! has_postgresql; then
        echo "ssb: the PostgreSQL store's tests need PostgreSQL (initdb, pg_ctl) and none was" \
             "found; on Debian/Ubuntu: sudo apt-get install postgresql" >&2
        exit 1
    fi
fi
ensure_venv "[test]"
python -m ruff check broker protocol client spark_bridge tools tsql tests bench examples
python -m ruff format --check --quiet broker protocol client spark_bridge tools tsql tests bench examples
bash scripts/typecheck.sh
NO_MKDOCS_2_WARNING=1 python -m mkdocs build --strict --quiet  # a broken link fails
if $fast; then
    python -m pytest -q -p no:cacheprovider -m "not slow" tests/unit tests/store tests/wire \
        tests/test_smoke.py "$@"
else
    python -m pytest -q -p no:cacheprovider tests "$@"
    if [ $# -eq 0 ]; then
        # the daemon tests closest to the store, again with the broker's state in PostgreSQL
        # (every daemon test: python -m pytest --store postgresql tests)
        python -m pytest -q -p no:cacheprovider --store postgresql tests/test_smoke.py \
            tests/test_transactions.py tests/test_durability.py tests/test_reconnect.py \
            tests/test_poison.py tests/test_activation.py
    fi
fi
