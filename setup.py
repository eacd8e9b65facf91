"""Every package folder installs, subpackages included (the rest is in pyproject.toml).

pyproject.toml maps each top-level folder into the `ssb` namespace
([tool.setuptools.package-dir]); setuptools' own configuration cannot name a folder's
subpackages but one by one, so they are found here: a package added under one of those
folders installs without another word.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import find_packages, setup

here = Path(__file__).resolve().parent
with (here / "pyproject.toml").open("rb") as pyproject:
    mapped: dict[str, str] = tomllib.load(pyproject)["tool"]["setuptools"]["package-dir"]

setup(
    packages=[
        name
        for package, folder in mapped.items()
        for name in (package, *(f"{package}.{sub}" for sub in find_packages(here / folder)))
    ]
)
