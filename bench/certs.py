"""Certificate issuance throughput of certmanager's issuer, against the crypto floor.

Issuing one leaf is one key generation, one CA signature, and building and encoding the
certificate and its key. The first two are OpenSSL's work and bound what any issuer in
this process could do; the rest is ours. So the floor, measured in the same run, is:

* ``raw_sign``: ECDSA P-256 signatures of a 200-byte message with SHA-256, one fixed key;
* ``keygen_sign``: a fresh P-256 key and one signature, the crypto of one issuance;
* ``raw_verify``: ECDSA P-256 verifications of such a signature, what checking a CSR costs.

Against them: ``Issuer.issue_service`` and ``Issuer.issue_proxy`` in process (the pure
domain, as the manager calls it; a proxy certificate is signed for the public key of the
proxy's CSR, made on the proxy's host, so it costs no key generation here),
``csr_proxy_certs``, the same with the CSR read and its signature checked first
(``public_key_from_csr``, as the servicer does before the manager is called), and
``grpc_proxy_certs``, the whole path of a real ``IssueCertificate`` call over loopback gRPC
(client stub, servicer, manager, issuer; the store is the in-memory fake, not Redis), one
call in flight. Proxy certificates are used there because each request names a new proxy,
so every call really signs; repeated service requests would be answered from the
manager's records.

Everything runs single-process, one operation at a time: these are per-core rates.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os

import grpc
from cryptography import x509
from cryptography.hazmat.backends.openssl import backend as openssl_backend
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from prometheus_client import CollectorRegistry

from bench import report
from trellis_api import certmanager_pb2 as pb
from trellis_api import certmanager_pb2_grpc as pb_grpc
from trellis_certmanager.domain import authority, issuer
from trellis_certmanager.domain.csr import public_key_from_csr
from trellis_certmanager.domain.keys import KeyAlgorithm
from trellis_certmanager.domain.records import CertificateRecord
from trellis_certmanager.manager import CertificateManager
from trellis_certmanager.metrics import CertMetrics
from trellis_certmanager.testing import InMemoryCertificateStore
from trellis_certmanager.transport import grpc_api
from trellis_common.ids import ProxyCommonName
from trellis_common.model import MeshService
from trellis_identity.identity import csr_for, new_key
from trellis_runtime.grpcserver import GrpcServer

NAMESPACE = "bench"
SERVICE = "checkout"
SERVICE_ACCOUNT = "checkout"
MESSAGE_SIZE = 200


def run(*, seconds: float = 2.0, warmup: float = 0.2) -> dict[str, float]:
    now = dt.datetime.now(dt.UTC)
    ca = authority.generate_root(
        KeyAlgorithm.ECDSA_P256, dt.timedelta(days=3650), now, "cluster.local"
    )
    leaf_issuer = issuer.Issuer(ca, KeyAlgorithm.ECDSA_P256, issuer.IssuancePolicy())
    service = MeshService(NAMESPACE, SERVICE)
    _check_signed_by(leaf_issuer.issue_service(service, SERVICE_ACCOUNT, now), ca.cert)

    def issue_service() -> object:
        return leaf_issuer.issue_service(service, SERVICE_ACCOUNT, now)

    proxy_key = ec.generate_private_key(ec.SECP256R1()).public_key()  # made on the proxy's host

    def issue_proxy() -> object:
        return leaf_issuer.issue_proxy(
            ProxyCommonName.new(SERVICE, NAMESPACE), SERVICE_ACCOUNT, now, public_key=proxy_key
        )

    proxy_csr = csr_for(new_key()[1], "bench proxy")

    def issue_proxy_for_csr() -> object:
        return leaf_issuer.issue_proxy(
            ProxyCommonName.new(SERVICE, NAMESPACE),
            SERVICE_ACCOUNT,
            now,
            public_key=public_key_from_csr(proxy_csr),
        )

    curve = ec.SECP256R1()
    algorithm = ec.ECDSA(hashes.SHA256())
    message = os.urandom(MESSAGE_SIZE)
    key = ec.generate_private_key(curve)
    signature, public_key = key.sign(message, algorithm), key.public_key()

    def raw_sign() -> object:
        return key.sign(message, algorithm)

    def keygen_sign() -> object:
        return ec.generate_private_key(curve).sign(message, algorithm)

    def raw_verify() -> None:
        public_key.verify(signature, message, algorithm)  # raises if it does not verify

    ops = {
        "service_certs": issue_service,
        "proxy_certs": issue_proxy,
        "csr_proxy_certs": issue_proxy_for_csr,
        "raw_sign": raw_sign,
        "keygen_sign": keygen_sign,
        "raw_verify": raw_verify,
    }
    rates = asyncio.run(_measure(ops, seconds, warmup))
    service_certs = report.Figure(
        "service_certs", rates["service_certs"], "certs/s", "Issuer.issue_service, in process"
    )
    proxy_certs = report.Figure(
        "proxy_certs", rates["proxy_certs"], "certs/s", "Issuer.issue_proxy, in process"
    )
    raw_signs = report.Figure(
        "raw_sign",
        rates["raw_sign"],
        "signs/s",
        f"floor: ECDSA P-256 sign of {MESSAGE_SIZE} bytes, SHA-256",
    )
    csr_proxy_certs = report.Figure(
        "csr_proxy_certs",
        rates["csr_proxy_certs"],
        "certs/s",
        "public_key_from_csr, then Issuer.issue_proxy, in process",
    )
    keygen_signs = report.Figure(
        "keygen_sign", rates["keygen_sign"], "ops/s", "floor: generate a P-256 key and sign once"
    )
    raw_verifies = report.Figure(
        "raw_verify",
        rates["raw_verify"],
        "verifies/s",
        f"floor: ECDSA P-256 verify of {MESSAGE_SIZE} bytes, SHA-256",
    )
    grpc_certs = report.Figure(
        "grpc_proxy_certs",
        rates["grpc_proxy_certs"],
        "certs/s",
        "IssueCertificate over loopback gRPC, 1 in flight",
    )
    figures = [
        service_certs,
        proxy_certs,
        csr_proxy_certs,
        raw_signs,
        keygen_signs,
        raw_verifies,
        grpc_certs,
    ]
    report.print_table(
        f"certs: leaf issuance, ECDSA P-256 ({openssl_backend.openssl_version_text()}), "
        f"{seconds:g} s per figure in {report.ROUNDS} interleaved rounds, single process",
        figures,
    )
    ratios = {
        "service_certs/raw_sign": report.ratio_line(service_certs, raw_signs),
        "service_certs/keygen_sign": report.ratio_line(service_certs, keygen_signs),
        "proxy_certs/keygen_sign": report.ratio_line(proxy_certs, keygen_signs),
        # the proxy made its key (a CSR): the server's side is a signature and encoding
        "proxy_certs/raw_sign": report.ratio_line(proxy_certs, raw_signs),
        # checking the CSR's signature is a verify, itself slower than a sign
        "csr_proxy_certs/raw_sign": report.ratio_line(csr_proxy_certs, raw_signs),
        "csr_proxy_certs/raw_verify": report.ratio_line(csr_proxy_certs, raw_verifies),
        "grpc_proxy_certs/proxy_certs": report.ratio_line(grpc_certs, proxy_certs, "baseline"),
    }
    return report.results(figures, ratios)


def _check_signed_by(record: CertificateRecord, ca_cert: x509.Certificate) -> None:
    """Make sure the loop measures real issuance: the leaf verifies against the CA."""
    leaf = x509.load_pem_x509_certificates(record.cert_chain_pem)[0]
    leaf.verify_directly_issued_by(ca_cert)


async def _measure(
    ops: dict[str, report.SyncOp], seconds: float, warmup: float
) -> dict[str, float]:
    """The in-process ``ops`` and, interleaved with them, ``grpc_proxy_certs``.

    The gRPC server and client share this event loop; the server is idle while the
    in-process ops run, so they run as they would alone.
    """

    async def announce(kind: str, common_name: str) -> int:
        return 0

    manager = CertificateManager(
        InMemoryCertificateStore(),
        announce,
        issuer.IssuancePolicy(),
        KeyAlgorithm.ECDSA_P256,
        CertMetrics(CollectorRegistry()),
    )
    await manager.start()
    server = GrpcServer(
        "127.0.0.1:0",
        [
            lambda s: pb_grpc.add_CertificateManagerServicer_to_server(
                grpc_api.CertificateManagerServicer(manager), s
            )
        ],
        [grpc_api.SERVICE_NAME],
    )
    port = await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.CertificateManagerStub(channel)
            request = pb.IssueCertificateRequest(
                kind=pb.CERTIFICATE_KIND_PROXY,
                service=pb.MeshService(namespace=NAMESPACE, name=SERVICE),
                service_account=SERVICE_ACCOUNT,
                csr_pem=csr_for(new_key()[1], "bench proxy"),  # one CSR, a new proxy id each
            )

            async def issue() -> object:
                answer = await stub.IssueCertificate(request, timeout=10)
                if not answer.cert_chain_pem:
                    raise RuntimeError("IssueCertificate answered without a certificate")
                return answer

            runners = {name: report.sync_runner(op) for name, op in ops.items()}
            runners["grpc_proxy_certs"] = report.async_runner(issue)
            return await report.measure_rates_async(runners, seconds, warmup)
    finally:
        await server.server.stop(None)
