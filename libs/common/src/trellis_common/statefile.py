"""Where a running mesh can be found: ``<state-dir>/services/<name>.json``.

Each service writes its addresses there when it is up and removes them when it stops, so
the CLI (``--state-dir``, ``TRELLIS_STATE_DIR``, default ``.trellis``) reaches a mesh that
was started by ``trellis up`` or by hand.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

SERVICES_DIR = "services"


@dataclass(frozen=True, slots=True)
class ServiceEndpoint:
    name: str
    admin_url: str
    grpc_address: str
    pid: int

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def _path(state_dir: Path, name: str) -> Path:
    return state_dir / SERVICES_DIR / f"{name}.json"


def write_endpoint(state_dir: Path, endpoint: ServiceEndpoint) -> Path:
    path = _path(state_dir, endpoint.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(endpoint.to_json())
    tmp.replace(path)
    return path


def remove_endpoint(state_dir: Path, name: str, pid: int) -> None:
    """Remove the file if it is still ours (a restarted service may have replaced it)."""
    current = read_endpoint(state_dir, name)
    if current is not None and current.pid == pid:
        _path(state_dir, name).unlink(missing_ok=True)


def read_endpoint(state_dir: Path, name: str) -> ServiceEndpoint | None:
    try:
        body = json.loads(_path(state_dir, name).read_text())
        return ServiceEndpoint(**body)
    except (OSError, ValueError, TypeError):
        return None


def read_endpoints(state_dir: Path) -> dict[str, ServiceEndpoint]:
    found: dict[str, ServiceEndpoint] = {}
    for path in sorted((state_dir / SERVICES_DIR).glob("*.json")):
        endpoint = read_endpoint(state_dir, path.stem)
        if endpoint is not None:
            found[endpoint.name] = endpoint
    return found
