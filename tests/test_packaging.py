"""The distribution as a user installs it: a wheel built from the source holds every
package (subpackages included) and its type markers, and works in a fresh environment."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD_FILES = ("pyproject.toml", "setup.py", "README.md")
INSTALL = ("--no-deps", "--no-index", "--quiet")
IMPORTS = "import ssb.broker._store, ssb.broker._transport, ssb.broker; print(ssb.broker.__file__)"


def _package_folders() -> dict[str, str]:
    """Installed package name -> folder, as pyproject.toml maps them."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        mapped: dict[str, str] = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return mapped


def _build_wheel(tmp_path: Path) -> Path:
    """A wheel built, as pip builds one, from a copy of the sources (nothing written here)."""
    source = tmp_path / "source"
    source.mkdir()
    for name in BUILD_FILES:
        shutil.copy2(ROOT / name, source / name)
    for folder in _package_folders().values():
        shutil.copytree(
            ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__")
        )
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(dist), "."],
        cwd=source,
        check=True,
        timeout=240,
    )
    (wheel,) = dist.glob("*.whl")
    return wheel


def _expected_files() -> set[str]:
    """Every package's __init__.py and every py.typed, as paths inside a wheel."""
    expected = set()
    for package, folder in _package_folders().items():
        for path in (ROOT / folder).rglob("*"):
            if path.name in ("__init__.py", "py.typed") and "__pycache__" not in path.parts:
                relative = path.relative_to(ROOT / folder).as_posix()
                expected.add(f"{package.replace('.', '/')}/{relative}")
    return expected


def test_a_wheel_installs_every_package_and_it_runs(tmp_path: Path) -> None:
    wheel = _build_wheel(tmp_path)
    expected = _expected_files()
    assert "ssb/broker/_store/__init__.py" in expected  # the folders were read
    with zipfile.ZipFile(wheel) as archive:
        missing = expected - set(archive.namelist())
    assert not missing, f"the wheel leaves out {sorted(missing)}"

    # a fresh environment with the wheel alone (no editable source), its dependencies
    # read from this one's site-packages
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", *INSTALL, str(wheel)],
        check=True,
        timeout=240,
    )
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}

    def installed(*argv: str) -> subprocess.CompletedProcess[str]:
        """Run `argv` in the fresh environment, away from the sources."""
        return subprocess.run(
            argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )

    site = installed(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    (Path(site.stdout.strip()) / "dependencies.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n"
    )
    imported = installed(str(python), "-c", IMPORTS)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.startswith(str(venv))  # the installed copy, not the source
    served = installed(str(venv / "bin" / "ssb"), "serve", "--help")
    assert served.returncode == 0, served.stderr
    assert served.stdout.startswith("usage: ssb serve")
