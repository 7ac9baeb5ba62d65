"""proxy-cp's serving certificate for the xDS port, rotated without a restart.

gRPC asks :meth:`ServingCertificate.fetch` at each handshake; it returns a new
configuration only after certmanager rotated the certificate. Client certificates are
verified against the mesh CA (the trust bundle that comes with the certificate).
"""

from __future__ import annotations

import grpc

from trellis_proxy_cp.translate.secrets import SecretMaterial


class ServingCertificate:
    def __init__(self, material: SecretMaterial) -> None:
        self.material = material
        self._served: SecretMaterial | None = material

    def update(self, material: SecretMaterial) -> None:
        self.material = material

    def configuration(self) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration(
            [(self.material.key_pem, self.material.cert_chain_pem)],
            root_certificates=self.material.trust_bundle_pem,
        )

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        if self._served is self.material:
            return None
        self._served = self.material
        return self.configuration()

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self.configuration(),
            self.fetch,  # type: ignore[arg-type]  # gRPC documents None as "no change"
            require_client_authentication=True,
        )
