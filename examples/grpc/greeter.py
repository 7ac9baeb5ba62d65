"""A greeter for the mesh, with no generated code: any method answers who served it.

    python greeter.py serve NAME DIR [PORT]    # mTLS with DIR's files (`trellis grpc bootstrap`)
    python greeter.py serve NAME --port 9000   # plaintext, behind a sidecar
    GRPC_XDS_BOOTSTRAP=DIR/bootstrap.json python greeter.py call xds:///hello.shop:9000 [N]

A proxyless client dials ``xds:///<service>.<namespace>:<port>`` with xDS credentials: the
mesh's routes, weights and mTLS come from proxy-cp; the certificate is the workload's own,
which ``trellis grpc agent`` renews in DIR.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from concurrent import futures
from pathlib import Path

import grpc
import grpc.experimental


def serve(name: str, folder: str | None, port: int) -> None:
    class Greeter(grpc.GenericRpcHandler):
        def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[bytes, bytes]:
            reply = json.dumps({"app": name, "method": details.method}).encode()
            return grpc.unary_unary_rpc_method_handler(lambda request, context: reply)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((Greeter(),))
    if folder is None:
        bound = server.add_insecure_port(f"127.0.0.1:{port}")
    else:
        files = Path(folder)

        def fetch() -> grpc.ServerCertificateConfiguration:  # re-read: the agent rotates them
            pair = ((files / "key.pem").read_bytes(), (files / "cert.pem").read_bytes())
            return grpc.ssl_server_certificate_configuration(
                [pair], (files / "ca.pem").read_bytes()
            )

        credentials = grpc.dynamic_ssl_server_credentials(fetch(), fetch, True)
        bound = server.add_secure_port(f"0.0.0.0:{port}", credentials)
    server.start()
    print(f"{name} serving on port {bound}", flush=True)
    server.wait_for_termination()


def call(target: str, count: int) -> None:
    fallback = grpc.experimental.insecure_channel_credentials()  # type: ignore[no-untyped-call]
    with grpc.secure_channel(target, grpc.xds_channel_credentials(fallback)) as channel:
        say: grpc.UnaryUnaryMultiCallable[bytes, bytes]
        say = channel.unary_unary("/helloworld.Greeter/SayHello")
        served: Counter[str] = Counter()
        for _ in range(count):
            try:
                served[json.loads(say(b"", timeout=5))["app"]] += 1
            except grpc.RpcError as exc:
                served[exc.code().name] += 1
        print(dict(served))


if __name__ == "__main__":
    if sys.argv[1] == "serve":  # serve NAME (DIR [PORT] | --port PORT)
        plain = sys.argv[3] == "--port"
        port = int(sys.argv[4]) if len(sys.argv) > 4 else 0
        serve(sys.argv[2], None if plain else sys.argv[3], port)
    else:
        call(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 10)
