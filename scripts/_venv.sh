# Sourced by serve.sh and test.sh: make (once) and enter the project's own virtual
# environment in .venv, so nothing is installed into the system's Python (PEP 668).
# Usage: ensure_venv EXTRAS   (e.g. "" or "[test]")
ensure_venv() {
    local extras="$1" here venv stamp
    here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    venv="$here/.venv"
    if [ ! -x "$venv/bin/python" ]; then
        if ! python3 -m venv "$venv" >/dev/null 2>&1; then
            rm -rf "$venv"
            if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
                echo "ssb: python3 cannot make a virtual environment; installing python3-venv" >&2
                apt-get install -y -qq python3-venv >/dev/null
                python3 -m venv "$venv"
            else
                echo "ssb: python3 cannot make a virtual environment here; install the" \
                     "python3-venv package (sudo apt-get install python3-venv) and run this again" >&2
                exit 1
            fi
        fi
    fi
    stamp="$venv/.installed$extras"
    if [ ! -e "$stamp" ] || [ "$here/pyproject.toml" -nt "$stamp" ]; then
        echo "ssb: installing into $venv ..." >&2
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "$here$extras"
        touch "$stamp"
    fi
    export PATH="$venv/bin:$PATH"
}
