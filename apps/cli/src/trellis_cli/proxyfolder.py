"""An onboarded proxy's folder on a host: the injector's answer and the key made here,
written where Envoy reads them (never through a planted symbolic link, secrets never
readable by others), and the command that runs Envoy on it.

``trellis vm bootstrap``, ``trellis gateway bootstrap``, the demo and the token and
gRPC-workload commands write their files with it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trellis_cli import swapdir
from trellis_cli.client import CliError
from trellis_common.bootstrap import proxy_secret_document, sidecar_args
from trellis_common.envoybin import EnvoyNotFound, find_envoy

BOOTSTRAP_FILE = "envoy.yaml"


def write_file(path: Path, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` with ``mode``, never through a symbolic link: a link
    planted where a proxy's file goes (by another local user, in a shared folder) would
    otherwise have the CLI write the mesh's files, or a key, wherever it points."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        os.fchmod(fd, mode)  # a file that was already there keeps its mode on O_CREAT
    except OSError:
        os.close(fd)
        raise
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


def write_private(path: Path, text: str) -> None:
    """Write a secret that is never readable by others, not even for a moment."""
    write_file(path, text, 0o600)


def _inside(folder: Path, given: str, what: str) -> Path:
    """The injector's path for a file, which must be directly in ``folder``."""
    path = Path(given)
    if path.parent != folder:
        raise CliError(f"the injector placed {what} at {given}, outside {folder}; not writing it")
    return path


@dataclass(frozen=True, slots=True)
class ProxyFolder:
    """Where an onboarded proxy's files were written."""

    config: Path
    cert_chain: Path
    workload_cert: Path
    key: Path
    trust_bundle: Path


def write_proxy_folder(folder: Path, key_pem: bytes, result: dict[str, Any]) -> ProxyFolder:
    """Write the injector's answer to ``POST /v1/bootstrap`` and the key made here, in
    the pod agent's layout (:mod:`.swapdir`: one version swapped in by one rename, as
    ``trellis proxy renew`` writes the next), then ``envoy.yaml`` last: a folder with it
    is complete. The SDS file names the proxy certificate and key; the bootstrap names the
    folder as the proxy's ``workload_dir``, where Envoy reads its own workload certificate."""
    files, paths = result["files"], result["paths"]
    written = ProxyFolder(
        config=folder / BOOTSTRAP_FILE,
        cert_chain=_inside(folder, paths["cert_chain"], "the certificate"),
        workload_cert=_inside(folder, paths["workload_cert"], "the workload certificate"),
        key=_inside(folder, paths["key"], "the private key"),
        trust_bundle=_inside(folder, paths["trust_bundle"], "the trust bundle"),
    )
    sds = _inside(folder, paths["sds"], "the SDS file")
    document = proxy_secret_document(written.cert_chain, written.key)
    try:
        swapdir.install(
            folder,
            {
                written.key.name: key_pem,
                written.cert_chain.name: files["cert_chain_pem"].encode(),
                written.workload_cert.name: files["workload_cert_chain_pem"].encode(),
                written.trust_bundle.name: files["trust_bundle_pem"].encode(),
                sds.name: yaml.safe_dump(document, sort_keys=False).encode(),
            },
        )
        write_file(written.config, yaml.safe_dump(result["bootstrap"], sort_keys=False))
    except OSError as exc:
        raise CliError(f"cannot write the proxy's files in {folder}: {exc}") from exc
    return written


def envoy_command(config: Path) -> list[str]:
    try:
        envoy = find_envoy()
    except EnvoyNotFound:
        envoy = "envoy"
    return [envoy, "-c", str(config), *sidecar_args()]
