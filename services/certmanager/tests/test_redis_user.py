"""certmanager's row of the Redis ACL table says what certmanager's code does (its store
tests run as its user: see ``redis_client`` in conftest.py)."""

from fnmatch import fnmatch

from trellis_certmanager.componentcerts import ISSUED_KEY, REVOKED_KEY
from trellis_certmanager.main import service
from trellis_certmanager.manager import TOPIC
from trellis_certmanager.store import RedisCertificateStore
from trellis_runtime.identityrevocation import IDENTITIES_TOPIC
from trellis_runtime.redisacl import COMPONENTS


def test_the_acl_table_row_matches_certmanager() -> None:
    row = COMPONENTS[service.name]
    assert row.kind == service.kind
    own = (TOPIC, IDENTITIES_TOPIC)
    assert (row.publishes, row.follows, row.discovers) == (own, own, ())  # replicas follow
    store = RedisCertificateStore(None, None)  # type: ignore[arg-type]  # only its keys
    keys = (store.ca_key, store.records_key, store.revoked_key, ISSUED_KEY, REVOKED_KEY)
    for key in (*keys, store.wanted_key, store.claims.key("a.b.svc"), store.claims.fence_key):
        assert any(fnmatch(key, f"trellis:{p}") for p in row.keys), key
