"""proxy-cp's serving certificate for the xDS port, rotated without a restart.

gRPC asks :meth:`ServingCertificate.fetch` at each handshake; it returns a new
configuration only after certmanager rotated the certificate. Client certificates are
verified against the mesh CA (the trust bundle that comes with the certificate).
"""

from __future__ import annotations

from collections.abc import Callable

import grpc

from trellis_proxy_cp.translate.secrets import SecretMaterial


class ServingCertificate:
    def __init__(self, material: SecretMaterial) -> None:
        self.material = material

    def update(self, material: SecretMaterial) -> None:
        self.material = material

    def configuration(self, clients: bool = True) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration(
            [(self.material.key_pem, self.material.cert_chain_pem)],
            root_certificates=self.material.trust_bundle_pem if clients else None,
        )

    def fetcher(
        self, clients: bool = True
    ) -> Callable[[], grpc.ServerCertificateConfiguration | None]:
        """What gRPC asks at each handshake of one port: a configuration once per new
        material, else None. Each port has its own (one port's fetch must not hide a
        rotation from another)."""
        served = self.material

        def fetch() -> grpc.ServerCertificateConfiguration | None:
            nonlocal served
            if served is self.material:
                return None
            served = self.material
            return self.configuration(clients)

        return fetch

    def credentials(self, clients: bool = True) -> grpc.ServerCredentials:
        """Credentials for one port; ``clients``: a client certificate of the mesh CA is
        required (every port but the enrollment port's)."""
        return grpc.dynamic_ssl_server_credentials(
            self.configuration(clients),
            self.fetcher(clients),  # type: ignore[arg-type]  # gRPC documents None as "no change"
            require_client_authentication=clients,
        )
