"""A gRPC application for mesh tests: any method of any service answers who it is.

It needs no generated code: a generic handler takes every method and answers a JSON body
(``{"app", "method", "metadata"}``) as the raw response bytes, so a test calls
``channel.unary_unary("/helloworld.Greeter/SayHello")`` with bytes and reads JSON back.
It serves plaintext (behind a sidecar) or mTLS with a certificate, key and CA from files
(proxyless: the files ``trellis grpc bootstrap`` writes, reloaded on each handshake so a
rotated certificate is served without a restart).
"""

from __future__ import annotations

import json
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc


class _Echo(grpc.GenericRpcHandler):
    def __init__(self, app: GrpcApp) -> None:
        self.app = app

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[bytes, bytes]:
        method = handler_call_details.method

        def answer(request: bytes, context: grpc.ServicerContext) -> bytes:
            self.app.calls += 1
            metadata = {k: v for k, v in context.invocation_metadata() if isinstance(v, str)}
            return json.dumps(
                {"app": self.app.name, "method": method, "metadata": metadata}
            ).encode()

        return grpc.unary_unary_rpc_method_handler(answer)


class GrpcApp:
    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = 0
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self.server.add_generic_rpc_handlers((_Echo(self),))
        self.port = 0

    def start(self, tls: tuple[Path, Path, Path] | None = None) -> GrpcApp:
        """Serve plaintext, or mTLS with ``(certificate, key, ca)`` files."""
        if tls is None:
            self.port = self.server.add_insecure_port("127.0.0.1:0")
        else:
            self.port = self.server.add_secure_port("127.0.0.1:0", _reloading(*tls))
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop(grace=None)


def _reloading(certificate: Path, key: Path, ca: Path) -> grpc.ServerCredentials:
    def fetch() -> Any:
        return grpc.ssl_server_certificate_configuration(
            [(key.read_bytes(), certificate.read_bytes())], ca.read_bytes()
        )

    return grpc.dynamic_ssl_server_credentials(fetch(), fetch, require_client_authentication=True)


def call(
    channel: grpc.Channel,
    method: str,
    metadata: tuple[tuple[str, str], ...] = (),
    timeout: float = 5,
) -> dict[str, Any]:
    """Call ``method`` (``/service/method``) and answer the app's JSON reply."""
    stub: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(method)
    body: dict[str, Any] = json.loads(stub(b"", metadata=metadata, timeout=timeout))
    return body
