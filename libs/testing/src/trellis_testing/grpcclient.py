"""A proxyless gRPC client for tests: ``python -m trellis_testing.grpcclient TARGET``.

It runs in its own process (``GRPC_XDS_BOOTSTRAP`` is read once per process), dials
``TARGET`` (``xds:///hello.shop:9000``) with xDS credentials (mTLS from the bootstrap's
certificate provider), and keeps that one channel while it reads commands from stdin, one
JSON object per line: ``{"method": "/svc/Method", "metadata": {"k": "v"}, "calls": N}``.
For each it writes one line: how many calls each app answered and how many failed, by
status code (``{"hello-v1": 80, "UNAVAILABLE": 3}``). A test can so watch a live channel
follow a route change.
"""

from __future__ import annotations

import json
import sys
from collections import Counter

import grpc
import grpc.experimental

from trellis_testing.grpcapp import call


def main() -> None:
    credentials = grpc.xds_channel_credentials(
        fallback_credentials=grpc.experimental.insecure_channel_credentials()  # type: ignore[no-untyped-call]
    )
    with grpc.secure_channel(sys.argv[1], credentials) as channel:
        for line in sys.stdin:
            command = json.loads(line)
            metadata = tuple((command.get("metadata") or {}).items())
            counts: Counter[str] = Counter()
            for _ in range(int(command.get("calls", 1))):
                try:
                    counts[call(channel, command["method"], metadata, timeout=5)["app"]] += 1
                except grpc.RpcError as exc:
                    counts[exc.code().name] += 1
            sys.stdout.write(json.dumps(counts) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
