#!/usr/bin/env bash
# mypy --strict over the packages as they install: the folders broker/, protocol/,
# client/, spark_bridge/, tools/ and tsql/ become ssb.broker, ssb.protocol, ... through a
# tree of symbolic links in build/typecheck (the source stays where it is); the benchmarks,
# bench/, are checked beside them as the package they run as.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
tree="$here/build/typecheck"
mkdir -p "$tree/ssb"
for package in broker protocol client spark_bridge tools tsql; do
    ln -sfn "$here/$package" "$tree/ssb/$package"
done
ln -sfn "$here/bench" "$tree/bench"
cd "$tree"
exec python -m mypy --config-file "$here/pyproject.toml" "$@"
