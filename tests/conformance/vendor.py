"""Copy the upstream Gateway API conformance manifests this suite reads into ``manifests/``,
byte for byte, from a clone of kubernetes-sigs/gateway-api at the pinned tag.

``python tests/conformance/vendor.py <path-to-gateway-api-clone>`` reads each file with
``git show <tag>:<path>`` (so the clone's checkout does not matter) and writes it under
``manifests/`` with upstream's relative path (``base/manifests.yaml``,
``tests/<name>.yaml``). Nothing is edited here: the class name is substituted and the
documents Trellis does not read are left out when a test loads them
(:mod:`tests.conformance.upstream`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TAG = "v1.6.1"
HERE = Path(__file__).resolve().parent
#: The per-test manifests read by the suite (``conformance/tests/<name>.yaml``).
TESTS = (
    "gateway-invalid-listeners-unsupported-protocol",
    "gateway-invalid-parameters-ref",
    "gateway-invalid-route-kind",
    "gateway-invalid-tls-configuration",
    "gateway-modify-listeners",
    "gateway-observed-generation-bump",
    "gateway-secret-invalid-reference-grant",
    "gateway-secret-missing-reference-grant",
    "gateway-secret-reference-grant-all-in-namespace",
    "gateway-secret-reference-grant-specific",
    "gateway-with-attached-routes",
    "gateway-with-attached-routes-with-port-8080",
    "gateway-http-listener-isolation",
    "gateway-http-listener-isolation-with-hostname-intersection",
    "grpcroute-exact-method-matching",
    "grpcroute-header-matching",
    "grpcroute-listener-hostname-matching",
    "httproute-cross-namespace",
    "httproute-disallowed-kind",
    "httproute-exact-path-matching",
    "httproute-header-matching",
    "httproute-https-listener",
    "httproute-hostname-intersection",
    "httproute-invalid-backendref-unknown-kind",
    "httproute-invalid-cross-namespace-backend-ref",
    "httproute-invalid-cross-namespace-parent-ref",
    "httproute-invalid-nonexistent-backendref",
    "httproute-invalid-parentref-not-matching-listener-port",
    "httproute-invalid-parentref-not-matching-section-name",
    "httproute-invalid-parentref-section-name-not-matching-port",
    "httproute-invalid-reference-grant",
    "httproute-listener-hostname-matching",
    "httproute-listener-port-matching",
    "httproute-matching",
    "httproute-matching-across-routes",
    "httproute-method-matching",
    "httproute-multiple-gateways",
    "httproute-observed-generation-bump",
    "httproute-omitted-backendrefs",
    "httproute-partially-invalid-via-invalid-reference-grant",
    "httproute-path-match-order",
    "httproute-query-param-matching",
    "httproute-reference-grant",
    "httproute-request-header-modifier",
    "httproute-request-header-modifier-backend",
    "httproute-response-header-modifier",
    "httproute-rewrite-host",
    "httproute-rewrite-path",
    "httproute-simple-same-namespace",
)


def copy(clone: Path) -> list[Path]:
    """Write every manifest from ``clone`` at :data:`TAG`; the files written."""
    paths = ["conformance/base/manifests.yaml"] + [f"conformance/tests/{t}.yaml" for t in TESTS]
    written = []
    for path in paths:
        text = subprocess.run(
            ["git", "-C", str(clone), "show", f"{TAG}:{path}"],
            check=True,
            capture_output=True,
        ).stdout
        target = HERE / "manifests" / path.removeprefix("conformance/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(text)
        written.append(target)
    return written


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} <path to a kubernetes-sigs/gateway-api clone>")
    for item in copy(Path(sys.argv[1])):
        print(item.relative_to(HERE))
