"""Reading a kubeconfig without the ``kubernetes`` package (``trellis_cli.kubelite``)."""

from __future__ import annotations

import base64
import datetime
import ssl
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from trellis_cli import kubelite
from trellis_cli.errors import CliError


def pem_pair(name: str) -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def write(path: Path, user: dict[str, Any], cluster: dict[str, Any]) -> Path:
    path.write_text(
        yaml.safe_dump({
            "clusters": [{"name": "c", "cluster": cluster}],
            "users": [{"name": "u", "user": user}],
            "contexts": [
                {"name": "one", "context": {"cluster": "c", "user": "u"}},
                {"name": "two", "context": {"cluster": "c", "user": "u"}},
            ],
            "current-context": "one",
        })
    )  # fmt: skip
    return path


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_a_token_and_an_inline_ca_and_client_certificate(tmp_path: Path) -> None:
    ca, _ = pem_pair("api-ca")
    cert, key = pem_pair("me")
    user = {"token": "t0k", "client-certificate-data": b64(cert), "client-key-data": b64(key)}
    cluster = {"server": "https://api.example:6443/", "certificate-authority-data": b64(ca)}
    lite = kubelite.load(write(tmp_path / "kc", user, cluster), None)
    assert lite is not None
    assert lite.server == "https://api.example:6443"
    assert lite.headers() == {"Authorization": "Bearer t0k"}
    assert lite.context is not None
    assert lite.context.verify_mode == ssl.CERT_REQUIRED
    # the API server's CA is the only one trusted
    [trusted] = lite.context.get_ca_certs()
    assert (("commonName", "api-ca"),) in trusted["subject"]
    # the key went through an anonymous memory file: nothing of it is left on disk
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kc"]


def test_files_next_to_the_kubeconfig_and_a_token_file(tmp_path: Path) -> None:
    ca, _ = pem_pair("api-ca")
    (tmp_path / "ca.pem").write_bytes(ca)
    (tmp_path / "token").write_text("from-file\n")
    lite = kubelite.load(
        write(tmp_path / "kc", {"tokenFile": "token"},
              {"server": "https://api:6443", "certificate-authority": "ca.pem"}),
        "two",
    )  # fmt: skip
    assert lite is not None
    assert lite.token == "from-file"


def test_a_plain_http_server_has_no_tls_context(tmp_path: Path) -> None:
    lite = kubelite.load(write(tmp_path / "kc", {}, {"server": "http://127.0.0.1:8080"}), None)
    assert lite is not None
    assert lite.context is None
    assert lite.headers() == {}


@pytest.mark.parametrize(
    "user", [{"exec": {"command": "aws"}}, {"auth-provider": {"name": "gcp"}}, {"username": "a"}]
)
def test_credentials_it_cannot_honour_go_to_the_kubernetes_package(
    tmp_path: Path, user: dict[str, Any]
) -> None:
    assert kubelite.load(write(tmp_path / "kc", user, {"server": "https://api"}), None) is None


def test_errors_name_what_is_wrong(tmp_path: Path) -> None:
    kc = write(tmp_path / "kc", {}, {"server": "api:6443"})
    with pytest.raises(CliError, match="is not an http"):
        kubelite.load(kc, None)
    with pytest.raises(CliError, match="no context named 'three'"):
        kubelite.load(kc, "three")
    broken = write(tmp_path / "kc2", {"client-key-data": "%%%", "client-certificate-data": "x"},
                   {"server": "https://api"})  # fmt: skip
    with pytest.raises(CliError, match="not base64"):
        kubelite.load(broken, None)
