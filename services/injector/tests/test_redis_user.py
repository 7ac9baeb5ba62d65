"""The injector's row of the Redis ACL table says what the injector's code does."""

from fnmatch import fnmatch

from trellis_identity.onboarding import TokenStore
from trellis_injector.clients import CATALOG, CERTMANAGER, PROXY_CP
from trellis_injector.main import service
from trellis_runtime.identityrevocation import RevokedIdentities
from trellis_runtime.redisacl import COMPONENTS


def test_the_acl_table_row_matches_the_injector() -> None:
    row = COMPONENTS[service.name]
    assert row.kind == service.kind
    assert row.publishes == ()
    assert row.follows == RevokedIdentities.topics  # the runtime's, in every component
    assert set(row.discovers) == {CERTMANAGER, CATALOG, PROXY_CP}
    # its onboarding tokens (the token store's tests run as the injector's user)
    key = TokenStore(None).key("0123456789abcdef")  # type: ignore[arg-type]  # only its key
    assert [p for p in row.keys if fnmatch(key, f"trellis:{p}")] == list(row.keys), key
