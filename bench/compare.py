"""Compare a benchmark between two checkouts of ssb, runs interleaved (A, B, A, B, ...).

The machines these run on are noisy: only figures from the same run mean anything, and
interleaving spreads the noise over both sides. Each side is a directory with its own
virtual environment in `.venv` (a clone at another commit: `git worktree add ../old
<commit>`, then `bash scripts/test.sh --co -q` or `python3 -m venv .venv && .venv/bin/pip
install -e .` there). The benchmark runs with each side's own code and its own
`bench/` module; the script reads the JSON each run writes and prints the medians and
the ratio B / A of every figure.

    python -m bench.compare ../old . --runs 5 -- --messages 100000 --durability both

`--b-args` adds arguments for side B only, so one checkout can be compared with itself
under another setting (TLS against plain TCP, same run):

    python -m bench.compare . . --runs 5 --b-args=--tls -- --messages 50000 --durability both

With `--smoke`, one run of each side, the benchmark in its own smoke mode: does the
comparison still run?

    python -m bench.compare . . --smoke
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ._common import parse_args


def _run(side: Path, module: str, args: list[str], timeout: float) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "result.json"
        python = side / ".venv" / "bin" / "python"
        done = subprocess.run(
            [str(python), "-m", module, *args, "--json", str(out)],
            cwd=side,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if not out.exists():
            raise SystemExit(
                f"{module} in {side} wrote no result (exit {done.returncode}):\n"
                f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
            )
        data = json.loads(out.read_text())
    if isinstance(data, dict) and isinstance(data.get("results"), list):
        data = data["results"]
    return data if isinstance(data, list) else [data]


def _figures(results: list[dict[str, Any]]) -> dict[str, float]:
    """Every numeric figure of a run, named by its peer and durability (when it has them)."""
    found: dict[str, float] = {}
    for result in results:
        prefix = ".".join(str(result[k]) for k in ("peer", "durability") if result.get(k))
        for key, value in result.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                found[f"{prefix}.{key}" if prefix else key] = float(value)
            elif isinstance(value, dict):
                for sub, inner in value.items():
                    if isinstance(inner, (int, float)) and not isinstance(inner, bool):
                        found[f"{prefix}.{key}.{sub}"] = float(inner)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.compare", description=__doc__.split("\n")[0]
    )
    parser.add_argument("a", type=Path, help="baseline checkout (with .venv)")
    parser.add_argument("b", type=Path, help="checkout to compare (with .venv)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--module", default="bench.e2e")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    parser.add_argument("--json", type=Path, help="also write every run's figures here")
    parser.add_argument("--b-args", default="", help="extra arguments for side B only")
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    opts = parse_args(parser, argv[:split], {"runs": 1})
    extra = [*argv[split + 1 :], *(["--smoke"] if opts.smoke else [])]
    runs: dict[str, list[dict[str, float]]] = {"a": [], "b": []}
    for n in range(opts.runs):
        for name, side in (("a", opts.a), ("b", opts.b)):
            print(f"run {n + 1}/{opts.runs}: {side} ...", file=sys.stderr, flush=True)
            args = [*extra, *opts.b_args.split()] if name == "b" else extra
            runs[name].append(_figures(_run(side.resolve(), opts.module, args, opts.timeout)))
    keys = sorted(set(runs["a"][0]) & set(runs["b"][0]))
    b_only = f" (B also {opts.b_args})" if opts.b_args else ""
    print(f"{opts.module} {' '.join(extra)}{b_only}: medians of {opts.runs} interleaved runs")
    print(f"{'figure':44s} {'A':>12s} {'B':>12s} {'B/A':>7s}")
    for key in keys:
        a = statistics.median(r[key] for r in runs["a"])
        b = statistics.median(r[key] for r in runs["b"])
        ratio = b / a if a else float("nan")
        print(f"{key:44s} {a:12.1f} {b:12.1f} {ratio:7.3f}")
    if opts.json is not None:
        opts.json.write_text(
            json.dumps({"a": str(opts.a), "b": str(opts.b), "runs": runs}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
