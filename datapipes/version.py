"""The installed version of datapipes, or the source tree's when it is not installed."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "datapipes-torch"
PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def package_version(distribution: str = DISTRIBUTION, pyproject: Path = PYPROJECT) -> str:
    """The version pip installed, else the ``version`` line of ``pyproject``, else ``"0+unknown"``.

    A source checkout on ``PYTHONPATH`` without ``pip install`` has no
    metadata, so the pyproject beside the package is the next truth.
    """
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        pass
    try:
        text = pyproject.read_text(encoding="utf-8")
    except OSError:
        return "0+unknown"
    # The [project] table's first `version = "..."` line; tomllib is not in Python 3.10.
    found = re.search(r'^version\s*=\s*"([^"]+)"', text, flags=re.MULTILINE)
    return found.group(1) if found else "0+unknown"
