"""The catalog's row of the Redis ACL table says what the catalog's code does."""

from trellis_catalog.clients.certs import CertificateFollower
from trellis_catalog.clients.providers import KIND, ProviderFollower
from trellis_catalog.main import service
from trellis_runtime.identityrevocation import RevokedIdentities
from trellis_runtime.redisacl import AUDIT_COMMANDS, COMPONENTS


def test_the_acl_table_row_matches_the_catalog() -> None:
    row = COMPONENTS[service.name]
    assert row.kind == service.kind
    assert row.publishes == ()  # proxy-cp watches its changes over gRPC (WatchChanges)
    # every component but certmanager follows the revoked identities (the runtime does)
    topics = {*ProviderFollower.topics, *CertificateFollower.topics, *RevokedIdentities.topics}
    assert topics == set(row.follows)
    assert {KIND, "certmanager"} == set(row.discovers)  # providers, and its locator
    assert set(AUDIT_COMMANDS) <= set(row.commands)  # it runs the Redis audit
    assert service.settings.model_fields["redis_audit_interval"].default > 0
