"""The project's one version: what ``trellis version`` prints, what every service reports
in ``/v1/status`` and as ``trellis_build_info{component,version,python}``, and what the
chart's ``appVersion`` and the image tag are (``tests/deploy`` checks they agree).

It is the installed distributions' version (every workspace member carries the same one,
checked by a test), read once from the package metadata.
"""

from __future__ import annotations

import platform
from functools import cache
from importlib import metadata
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

#: The distribution whose version is the project's (every member has the same).
DISTRIBUTION = "trellis-common"
UNKNOWN = "0+unknown"


@cache
def version() -> str:
    """The installed version, or :data:`UNKNOWN` when run from files not installed."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return UNKNOWN


def count_build(registry: CollectorRegistry, component: str) -> None:
    """``trellis_build_info{component,version,python} 1`` in ``registry``, as Prometheus'
    ``*_build_info`` convention has it (join on it to label other series by version)."""
    from prometheus_client import Gauge  # not for `trellis version`, which must start fast

    Gauge(
        "trellis_build_info",
        "The Trellis build this process runs: always 1, the version in the labels",
        ["component", "version", "python"],
        registry=registry,
    ).labels(component, version(), platform.python_version()).set(1)
