"""proxy-cp's row of the Redis ACL table says what proxy-cp's code does."""

from trellis_proxy_cp.clients.certs import CertificateFollower
from trellis_proxy_cp.main import service
from trellis_runtime.identityrevocation import RevokedIdentities
from trellis_runtime.redisacl import COMPONENTS


def test_the_acl_table_row_matches_proxy_cp() -> None:
    row = COMPONENTS[service.name]
    assert row.kind == service.kind
    assert row.publishes == ()  # it only listens (and announces itself)
    topics = {*CertificateFollower.topics, *RevokedIdentities.topics}  # the catalog: a stream
    assert topics == set(row.follows)
    assert set(row.discovers) == {"catalog", "certmanager"}  # its two locators
    assert row.keys == ()
