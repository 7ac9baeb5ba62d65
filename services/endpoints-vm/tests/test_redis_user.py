"""endpoints-vm's row of the Redis ACL table says what endpoints-vm's code does (its store
tests run as its user: see ``redis_client`` in conftest.py)."""

from fnmatch import fnmatch

from trellis_common.identityrevocation import RevokedIdentities
from trellis_common.onboarding import TokenStore
from trellis_common.redisacl import COMPONENTS
from trellis_endpoints_vm.main import service
from trellis_endpoints_vm.manager import TOPIC
from trellis_endpoints_vm.store import RedisWorkloadStore


def test_the_acl_table_row_matches_endpoints_vm() -> None:
    row = COMPONENTS[service.name]
    assert row.kind == service.kind
    # certmanager: to join and renew its own identity
    assert (row.publishes, row.discovers) == ((TOPIC,), ("certmanager",))
    assert row.follows == RevokedIdentities.topics  # the runtime's, in every component
    key = RedisWorkloadStore(None).key  # type: ignore[arg-type]  # only its key
    assert any(fnmatch(key, f"trellis:{p}") for p in row.keys), key
    # it reads the injector's onboarding tokens (registration with a scoped token)
    token = TokenStore(None).key("0123456789abcdef")  # type: ignore[arg-type]
    assert [p for p in row.reads if fnmatch(token, f"trellis:{p}")] == list(row.reads), token
