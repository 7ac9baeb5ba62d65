"""endpoints-vm's row of the Redis ACL table says what endpoints-vm's code does (its store
tests run as its user: see ``redis_client`` in conftest.py)."""

from fnmatch import fnmatch

from trellis_endpoints_vm.main import service
from trellis_endpoints_vm.manager import MIRROR
from trellis_endpoints_vm.replicas import WorkloadFollower
from trellis_endpoints_vm.store import RedisWorkloadStore
from trellis_identity.onboarding import TokenStore
from trellis_runtime.identityrevocation import RevokedIdentities
from trellis_runtime.redisacl import COMPONENTS


def test_the_acl_table_row_matches_endpoints_vm() -> None:
    row = COMPONENTS[service.name]
    assert row.kind == service.kind
    # certmanager: to join and renew its own identity; MIRROR: its replicas' changes
    assert (row.publishes, row.discovers) == ((MIRROR,), ("certmanager",))
    # the runtime's (in every component), and the other replicas' changes
    assert row.follows == (*RevokedIdentities.topics, *WorkloadFollower.topics)
    store = RedisWorkloadStore(None)  # type: ignore[arg-type]  # only its keys
    for key in (store.key, store.heartbeat_key):
        assert any(fnmatch(key, f"trellis:{p}") for p in row.keys), key
    # it reads the injector's onboarding tokens (registration with a scoped token)
    token = TokenStore(None).key("0123456789abcdef")  # type: ignore[arg-type]
    assert [p for p in row.reads if fnmatch(token, f"trellis:{p}")] == list(row.reads), token
