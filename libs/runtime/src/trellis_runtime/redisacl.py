"""Who may touch what in Redis: one ACL user per component, written from one table.

Redis holds the mesh's durable state (the sealed CA and certificate records, VM
registrations), the service registry, and the signaling counters and channels. Any
process that can reach Redis with a password that works for everything could read or
overwrite all of it, so each component gets its own Redis user (Redis 7 ACL), limited to:

* **its own keys** (``~``, read and write): its store (``trellis:certmanager:*``...), its
  own registry records (``trellis:registry:<kind>:*``) and the revision counter of each
  topic it publishes (``trellis:rev:<topic>``);
* **reading** (``%R~``) the registry records of the kinds it looks up, and the revision
  counters of the topics it follows;
* **subscribing** (``&``) to the channels of the topics it follows, and to its own
  subscriber control channels (``trellis:subscriber:<component>:*``);
* **publishing** only on the channels of the topics it owns and on its control channels.
  Redis checks one channel list for both PUBLISH and SUBSCRIBE, so PUBLISH is granted in a
  *selector* of its own (``(+publish &...)``, Redis 7.0+): a follower of ``certificates``
  may listen on that channel but not ring it;
* **the commands it uses**, and nothing else (no ``KEYS``, ``FLUSHALL``, ``CONFIG``...).

The rules are Redis's own syntax (checked against 7.0), so the same lines serve an
``aclfile`` (``trellis up``), ``ACL SETUSER`` (an operator's own Redis) and, later, the
Helm chart. The ``default`` user is switched off: a connection without a password can only
``AUTH``. ``admin`` is the operator's break-glass user (everything); no service uses it.

Passwords never enter the ACL text: Redis is given their SHA-256 (``#<hex>``).

Redis under Sentinel (:mod:`trellis_runtime.sentinelurl`) has two more users, neither of
them a component: :data:`REPLICATION`, which a replica logs in to its master as
(``masteruser``: PSYNC, REPLCONF and PING, nothing else), and :data:`SENTINEL`, which the
sentinels log in to Redis as, with the commands Sentinel's documentation lists (INFO, ROLE,
REPLICAOF (SLAVEOF), CONFIG REWRITE, CLIENT KILL... and its hello channel only). The
sentinels have an ACL of their own (:func:`sentinel_acl_lines`): each component may only
ask where the master is, with the same user and password as on Redis; :data:`SENTINEL`
is also how the sentinels log in to each other.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from trellis_runtime.signaling import DEFAULT_PREFIX

#: The operator's user: every key, channel and command. No service runs as it.
ADMIN = "admin"

#: What every component does through the shared runtime: PING (readiness), the registry
#: (SET with GET and PX, DEL on stop; SCAN and MGET to discover), the publish transaction
#: (WATCH the counter, GET, MULTI, SET, PUBLISH, EXEC; DISCARD/UNWATCH on a retry), the
#: subscriber (GET and MGET of counters, SUBSCRIBE; UNSUBSCRIBE on close). No user may run
#: scripts (EVAL, EVALSHA, SCRIPT, FUNCTION) or admin commands: :mod:`.redisatomic`.
BASE_COMMANDS = (
    "ping",
    "get",
    "mget",
    "set",
    "del",
    "incr",
    "scan",
    "watch",
    "unwatch",
    "multi",
    "exec",
    "discard",
    "subscribe",
    "unsubscribe",
)
#: The hash-store commands (:mod:`trellis_runtime.stored` and the stores built on it).
HASH_COMMANDS = ("hgetall", "hget", "hset", "hdel", "hlen", "hkeys")
#: What the Redis audit reads (:mod:`trellis_runtime.redisaudit`).
AUDIT_COMMANDS = ("acl|log", "info")
#: A write that must survive a failover waits for a replica (:func:`.redisconn.replicated`).
DURABLE_COMMANDS = ("wait",)

#: The user replicas log in to their master as (``masteruser``).
REPLICATION = "replication"
#: The user the sentinels log in to Redis, and to each other, as.
SENTINEL = "sentinel"
#: The Sentinel's hello channel, where the sentinels of a master find each other.
SENTINEL_CHANNEL = "__sentinel__:hello"
#: Rules of the users that are not components (their passwords apart).
SPECIAL_RULES: Mapping[str, tuple[str, ...]] = {
    ADMIN: ("~*", "&*", "+@all"),
    REPLICATION: ("resetkeys", "resetchannels", "-@all", "+psync", "+replconf", "+ping"),
    # Sentinel's documented set (redis.io: Sentinel, "Redis Access Control List
    # authentication"), its hello channel only instead of every channel
    SENTINEL: (
        "resetkeys",
        "resetchannels",
        f"&{SENTINEL_CHANNEL}",
        "-@all",
        "+multi",
        "+exec",
        "+slaveof",
        "+replicaof",
        "+ping",
        "+subscribe",
        "+publish",
        "+config|rewrite",
        "+role",
        "+info",
        "+client|setname",
        "+client|kill",
        "+script|kill",
    ),
}
#: What a component may ask a sentinel: where the master (and the replicas) are.
SENTINEL_QUERIES = (
    "+ping",
    "+sentinel|masters",
    "+sentinel|slaves",
    "+sentinel|replicas",
    "+sentinel|get-master-addr-by-name",
)


@dataclass(frozen=True)
class Component:
    """One control-plane component's rights; see the module docstring for the mapping."""

    name: str
    #: Its kind in the service registry (its records are ``trellis:registry:<kind>:*``).
    kind: str
    #: Key patterns of its own store (read and write).
    keys: tuple[str, ...] = ()
    #: Key patterns of another component's store it only reads.
    reads: tuple[str, ...] = ()
    #: Signaling topics it owns (publishes).
    publishes: tuple[str, ...] = ()
    #: Signaling topics it follows (subscribes to).
    follows: tuple[str, ...] = ()
    #: Registry kinds it looks up (the locator, provider discovery; every component but
    #: certmanager looks up certmanager to join and to renew its identity).
    discovers: tuple[str, ...] = ()
    #: Commands besides :data:`BASE_COMMANDS`.
    commands: tuple[str, ...] = ()

    def rules(self, prefix: str = DEFAULT_PREFIX) -> list[str]:
        """The ACL rules of this user, without its password."""
        owned = ("registry", *self.publishes)  # every component announces itself
        control = f"&{prefix}:subscriber:{self.name}:*"
        return [
            "resetkeys",
            "resetchannels",
            "-@all",
            *(f"+{c}" for c in dict.fromkeys((*BASE_COMMANDS, *self.commands))),
            *(f"~{prefix}:{k}" for k in self.keys),
            *(f"%R~{prefix}:{k}" for k in self.reads),
            f"~{prefix}:registry:{self.kind}:*",
            *(f"%R~{prefix}:registry:{k}:*" for k in self.discovers if k != self.kind),
            *(f"~{prefix}:rev:{t}" for t in dict.fromkeys(owned)),
            *(f"%R~{prefix}:rev:{t}" for t in self.follows if t not in owned),
            *(f"&{prefix}:events:{t}" for t in self.follows),
            control,
            "(+publish "
            + " ".join([*(f"&{prefix}:events:{t}" for t in dict.fromkeys(owned)), control])
            + ")",
        ]


def leader_keys(name: str) -> tuple[str, str]:
    """The keys of the Redis lock of the leader election ``name``
    (:mod:`trellis_kube.redislocks`): the lock and its fencing counter. A component may
    hold the locks of the elections named after it (``<component>``) only."""
    return (f"leader:{name}", f"leader:{name}:*")


#: The table: every component, what it owns, follows and looks up. Read this to know who
#: may touch what; the tests run each service's store against a Redis with only its user.
COMPONENTS: Mapping[str, Component] = {
    c.name: c
    for c in (
        Component(
            "certmanager",
            kind="certmanager",
            # :ca, :certs, :revoked, :join-spent:<nonce>; and its leader election's lock
            keys=("certmanager:*", *leader_keys("certmanager")),
            publishes=("certificates", "identities"),
            # its own topics: each replica follows the others' changes (coherence.py)
            follows=("certificates", "identities"),
            # sealing old records: a WATCHed swap (redisatomic); WAIT: a certificate record
            # and a revocation are on a replica before they are answered; INCRBY (redis-py's
            # incr): its leader election's fencing counter (redislocks)
            commands=(*HASH_COMMANDS, *DURABLE_COMMANDS, "incrby"),
        ),
        Component(
            "endpoints-vm",
            kind="endpoints-provider",
            # :workloads, :onboarding-uses:<id>; and its leader election's lock
            keys=("endpoints-vm:*", *leader_keys("endpoints-vm")),
            # the injector's onboarding tokens: a scoped token registers a workload
            reads=("injector:onboarding-tokens:*",),
            # workloads: what a replica changed, for the other replicas (it follows it too);
            # its services' changes go to the catalog's watch (WatchServices), not Redis
            publishes=("workloads",),
            follows=("identities", "workloads"),
            discovers=("certmanager",),  # to join and renew its identity
            # a token's uses: taken (INCRBY, redis-py's incr) and given back (DECRBY);
            # WAIT: an acknowledged registration is on a replica; HMGET: the heartbeats
            # another replica heard, read back before the leader judges a TTL
            # tombstones: a sorted set scored by time (store.py); EXISTS finds the hash of
            # tombstones an earlier version wrote, which the first prune moves into it
            commands=(
                *HASH_COMMANDS,
                "incrby",
                "decrby",
                "hmget",
                "zadd",
                "zrem",
                "zmscore",
                "zremrangebyscore",
                "zremrangebyrank",
                "exists",
                *DURABLE_COMMANDS,
            ),
        ),
        Component(
            "endpoints-k8s",
            kind="endpoints-provider",  # the registry kind the catalog discovers providers by
            # no keys, no signals: every replica serves the catalog's watch from its informers
            follows=("identities",),
            discovers=("certmanager",),  # to join and renew its identity
        ),
        Component(
            "catalog",
            kind="catalog",
            follows=("registry", "certificates", "identities"),  # providers: WatchServices
            discovers=("endpoints-provider", "certmanager"),
            commands=AUDIT_COMMANDS,  # the catalog runs the Redis audit
        ),
        Component(
            "proxy-cp",
            kind="proxy-cp",
            follows=("certificates", "identities"),  # the catalog's changes: WatchChanges
            discovers=("catalog", "certmanager"),
        ),
        Component(
            "injector",
            kind="injector",
            # :onboarding-tokens:<id> (SET PX NX, GET, SCAN, MGET, DEL), :onboarding-uses:<id>
            keys=("injector:*",),
            follows=("identities",),
            discovers=("certmanager", "catalog", "proxy-cp"),
            # a token's uses: taken (INCRBY, redis-py's incr) and given back (DECRBY)
            commands=("incrby", "decrby"),
        ),
    )
}


def password_hash(password: str) -> str:
    return hashlib.sha256(password.encode()).hexdigest()


def user_line(name: str, password: str, prefix: str = DEFAULT_PREFIX) -> str:
    """One ``user`` line of an aclfile (the password as its SHA-256 only)."""
    rules = list(SPECIAL_RULES[name]) if name in SPECIAL_RULES else COMPONENTS[name].rules(prefix)
    return " ".join(["user", name, "on", f"#{password_hash(password)}", *rules])


def aclfile_text(passwords: Mapping[str, str], prefix: str = DEFAULT_PREFIX) -> str:
    """A whole aclfile: the default user off, then one user per entry of ``passwords``."""
    unknown = sorted(set(passwords) - {*SPECIAL_RULES, *COMPONENTS})
    if unknown:
        raise ValueError(
            f"no ACL rules for {unknown}: the users are {[*SPECIAL_RULES, *COMPONENTS]}"
        )
    lines = ["user default off resetkeys resetchannels -@all"]
    lines += [user_line(name, passwords[name], prefix) for name in sorted(passwords)]
    return "\n".join(lines) + "\n"


def sentinel_acl_lines(passwords: Mapping[str, str]) -> list[str]:
    """The ``user`` lines of a sentinel's configuration (Sentinel reads no aclfile): the
    default user off, :data:`ADMIN` and :data:`SENTINEL` (the other sentinels) everything,
    each component (the same password as on Redis) :data:`SENTINEL_QUERIES` only."""
    lines = ["user default off resetkeys resetchannels -@all"]
    for name in sorted(passwords):
        if name in (ADMIN, SENTINEL):
            rules: tuple[str, ...] = ("~*", "&*", "+@all")
        elif name in COMPONENTS:
            rules = ("resetkeys", "resetchannels", "-@all", *SENTINEL_QUERIES)
        else:
            continue  # the replication user has nothing to do on a sentinel
        lines.append(" ".join(["user", name, "on", f"#{password_hash(passwords[name])}", *rules]))
    return lines


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (made 0600 before the data)."""
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_text(text)


def ensure_passwords(users_dir: Path, names: tuple[str, ...] | None = None) -> dict[str, Path]:
    """A password file (0600, in a 0700 folder) per user, made once and then kept.

    ``names`` defaults to :data:`ADMIN` and every component. A file that exists is kept, so
    a restarted mesh keeps its passwords; deleting one rotates it at the next start.
    """
    users_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    users_dir.chmod(0o700)
    files = {}
    for name in names or (ADMIN, *COMPONENTS):
        path = users_dir / name
        if not path.is_file() or not path.read_text().strip():
            _write_private(path, secrets.token_urlsafe(32) + "\n")
        path.chmod(0o600)
        files[name] = path
    return files


def write_aclfile(path: Path, password_files: Mapping[str, Path]) -> Path:
    """The aclfile (0600) for the users whose password files are given."""
    passwords = {name: file.read_text().strip() for name, file in password_files.items()}
    _write_private(path, aclfile_text(passwords))
    return path
