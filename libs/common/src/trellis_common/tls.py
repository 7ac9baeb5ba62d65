"""Credentials for mTLS on gRPC, from PEM bytes.

Servers that proxies reach (proxy-cp) require a client certificate from the mesh CA;
internal APIs use the same helpers when mTLS between services is switched on.
"""

from __future__ import annotations

import grpc


def server_credentials(
    cert_chain_pem: bytes, key_pem: bytes, client_ca_pem: bytes | None, *, require_client_auth: bool
) -> grpc.ServerCredentials:
    """TLS server credentials; with ``require_client_auth`` the peer must chain to the CA."""
    if require_client_auth and not client_ca_pem:
        raise ValueError("require_client_auth needs client_ca_pem")
    return grpc.ssl_server_credentials(
        [(key_pem, cert_chain_pem)],
        root_certificates=client_ca_pem,
        require_client_auth=require_client_auth,
    )


def channel_credentials(
    ca_pem: bytes, cert_chain_pem: bytes | None = None, key_pem: bytes | None = None
) -> grpc.ChannelCredentials:
    """TLS channel credentials; with a certificate and key the client authenticates too."""
    if (cert_chain_pem is None) != (key_pem is None):
        raise ValueError("client certificate and key go together")
    return grpc.ssl_channel_credentials(
        root_certificates=ca_pem, private_key=key_pem, certificate_chain=cert_chain_pem
    )
