"""A Destination API client generated from upstream's protos, run as its own process.

The test generates Python from ``proto/vendor`` (upstream's files, byte for byte) with
``grpc_tools.protoc`` into a folder of its own, and runs this script with that folder first
on ``sys.path``: the modules are upstream's (``destination_pb2``, ``proxy.destination``),
not ``trellis_api``'s, and live in a process of their own (two copies of one proto package
cannot share a descriptor pool). Each message received is printed as one JSON line; the
stream's end is printed as ``{"status": CODE, "details": ...}``.

    python linkerd_client.py GENERATED {linkerd|conduit} {Get|GetProfile} ADDRESS PATH \\
        CERT KEY CA [CONTEXT_TOKEN]
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

SERVER_NAME = "proxy-cp.trellis-system.svc.cluster.local"


def main(argv: list[str]) -> int:
    generated, api, rpc, address, path, cert, key, ca, *rest = argv
    sys.path.insert(0, generated)
    import grpc  # after the path: the generated modules import it
    from google.protobuf import json_format

    credentials = grpc.ssl_channel_credentials(
        root_certificates=Path(ca).read_bytes(),
        private_key=Path(key).read_bytes(),
        certificate_chain=Path(cert).read_bytes(),
    )
    options = [("grpc.ssl_target_name_override", SERVER_NAME)]
    channel = grpc.secure_channel(address, credentials, options=options)
    request: Any
    if api == "linkerd":
        messages: Any = importlib.import_module("destination_pb2")
        services: Any = importlib.import_module("destination_pb2_grpc")
        request = messages.GetDestination(
            scheme="k8s", path=path, context_token=rest[0] if rest else ""
        )
    else:
        common: Any = importlib.import_module("common.common_pb2")
        services = importlib.import_module("proxy.destination.destination_pb2_grpc")
        request = common.Destination(scheme="k8s", path=path)
    stub = services.DestinationStub(channel)
    try:
        for message in getattr(stub, rpc)(request):
            line = json_format.MessageToDict(message, preserving_proto_field_name=True)
            print(json.dumps({"message": line}), flush=True)
    except grpc.RpcError as exc:
        print(json.dumps({"status": exc.code().name, "details": exc.details()}), flush=True)
        return 0
    print(json.dumps({"status": "OK", "details": ""}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
