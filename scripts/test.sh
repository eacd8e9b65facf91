#!/usr/bin/env bash
# Install everything the tests need into .venv, then run them all (the README's
# test command). The Spark tests need Java 17 or 21, the dashboard tests Chromium, the
# PostgreSQL store's tests PostgreSQL: as root with apt-get each is installed, otherwise
# its absence stops here.
#
# --fast (first argument): the developer's loop. The same checks, then only the unit,
# store, wire and smoke tests, which need neither Java nor a browser.
# Other arguments go to pytest (e.g. -m "not slow", -k NAME).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_venv.sh
fast=false
if [ "${1:-}" = "--fast" ]; then
    fast=true
    shift
fi

# need CHECK PACKAGE TESTS WHAT: when CHECK fails, install Debian's PACKAGE (as root with
# apt-get); if CHECK still fails, say that TESTS need WHAT and stop.
need() {
    local check="$1" package="$2" tests="$3" what="$4"
    "$check" && return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "ssb: $tests need $what; installing $package" >&2
        apt-get install -y -qq "$package" >/dev/null 2>&1 \
            || { apt-get update -qq && apt-get install -y -qq "$package"; } >/dev/null 2>&1 \
            || true
    fi
    if ! "$check"; then
        echo "ssb: $tests need $what and none was found; on Debian/Ubuntu:" \
             "sudo apt-get install $package" >&2
        exit 1
    fi
}
has_java() {
    if [ -n "${JAVA_HOME:-}" ]; then [ -x "$JAVA_HOME/bin/java" ]; else command -v java >/dev/null 2>&1; fi
}
# The dashboard tests drive Debian's Chromium (the `chromium` package), never a
# downloaded browser.
has_chromium() { command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; }
# The PostgreSQL store's tests start a server of Debian's `postgresql` package.
has_postgresql() { command -v initdb >/dev/null 2>&1 || compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; }
if ! $fast; then
    need has_java openjdk-17-jre-headless "the Spark tests" "Java 17 or 21 (JAVA_HOME, or java on the PATH)"
    need has_chromium chromium "the dashboard tests" "Chromium"
fi
need has_postgresql postgresql "the PostgreSQL store's tests" "PostgreSQL (initdb, pg_ctl)"
ensure_venv "[test]"
python -m ruff check broker protocol client spark_bridge tools tsql tests bench examples
python -m ruff format --check --quiet broker protocol client spark_bridge tools tsql tests bench examples
bash scripts/typecheck.sh
NO_MKDOCS_2_WARNING=1 python -m mkdocs build --strict --quiet  # a broken link fails
# The whole suite runs in two worker processes (pytest-xdist), a test file to a worker
# (its module fixtures shared): most tests wait on daemons, disks and sockets, not on a
# processor. One processor: one worker. A later -n in the arguments wins.
parallel="-n $(( $(nproc) >= 2 ? 2 : 1 )) --dist loadfile"
if $fast; then
    python -m pytest -q -p no:cacheprovider -m "not slow" tests/unit tests/store tests/wire \
        tests/test_smoke.py "$@"
else
    python -m pytest -q -p no:cacheprovider $parallel tests "$@"
    if [ $# -eq 0 ]; then
        # the daemon tests closest to the store, again with the broker's state in PostgreSQL
        # (every daemon test: python -m pytest --store postgresql tests)
        python -m pytest -q -p no:cacheprovider $parallel --store postgresql tests/test_smoke.py \
            tests/test_transactions.py tests/test_durability.py tests/test_reconnect.py \
            tests/test_poison.py tests/test_activation.py tests/tsql/test_tutorials.py \
            tests/test_tables.py tests/test_tables_durability.py tests/tsql/test_table_features.py \
            "tests/tsql/test_broker.py::test_a_state_table_keyed_by_conversation_group_with_receive_and_send" \
            "tests/tsql/test_broker.py::test_a_failed_table_statement_has_sql_servers_number" \
            "tests/tsql/test_broker.py::test_a_stored_procedure_changes_tables_in_its_callers_transaction" \
            "tests/tsql/test_cli.py::test_a_script_keeping_its_state_in_a_table_runs_unchanged"
    fi
fi
