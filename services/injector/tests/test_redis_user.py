"""The injector's row of the Redis ACL table says what the injector's code does."""

from trellis_common.redisacl import COMPONENTS
from trellis_injector.clients import CATALOG, CERTMANAGER, PROXY_CP
from trellis_injector.main import service


def test_the_acl_table_row_matches_the_injector() -> None:
    row = COMPONENTS[service.name]
    assert row.kind == service.kind
    assert (row.publishes, row.follows, row.keys) == ((), (), ())
    assert set(row.discovers) == {CERTMANAGER, CATALOG, PROXY_CP}
