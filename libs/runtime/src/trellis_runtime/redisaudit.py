"""What Redis refused, logged and counted where an operator looks: a periodic reader.

Redis enforces the ACL (:mod:`trellis_runtime.redisacl`) and keeps the evidence itself, in
two places, neither of which anyone watches by default:

* ``INFO errorstats`` counts every error reply by its code since Redis started:
  ``NOAUTH`` (a command from a connection that never logged in: a client without a
  password, the default user being off), ``WRONGPASS`` (a failed login) and ``NOPERM``
  (a command, key or channel the user may not touch). This is the complete count, but it
  says nothing about who.
* ``ACL LOG`` keeps the last denials (128 by default) with the user, the reason
  (``command``, ``key``, ``channel``, ``auth``), the key or channel, the command and the
  client's address. Redis 7.0 folds repeats of one (reason, object, user) within a minute
  into one entry with a ``count``; the entries have no id, so a new denial is one whose
  ``count`` grew (or a new entry).

:class:`RedisAudit` reads both every ``interval`` and turns what is new into log lines
(``redis.refused error=NOAUTH count=1``, ``redis.acl_denied user=proxy-cp reason=key
object=trellis:certmanager:ca command=get client=127.0.0.1:5000 count=1``) and into
``trellis_redis_refusals_total{error}`` and ``trellis_redis_acl_denied_total{user,
reason}`` (``user`` is one of the known ACL users or ``other``: a failed login names
whatever user the client sent, which must not grow the metric without bound).

The first read is the baseline: what Redis refused before this process started is in the
counts of the process that ran then, and is summed up once (``redis.audit_started``). A
Redis that restarted (a new ``run_id``, or counters that went down) starts from zero again.
One process runs the audit (the catalog; ``redis_audit_interval``), whose ACL user alone
may run ``ACL LOG`` and ``INFO``; if its user may not, the audit says so once and stops.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, Counter
from redis.exceptions import NoPermissionError, RedisError

from trellis_common.backoff import wait_or_stop

log = logging.getLogger(__name__)

#: The error codes that are refusals (every other error reply is a bug or a bad request).
REFUSAL_ERRORS = ("NOAUTH", "WRONGPASS", "NOPERM")

EntryKey = tuple[str, str, str, str]  # reason, context, object, username


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class RedisAudit:
    """Reads Redis's refusals every ``interval`` seconds; see the module docstring."""

    def __init__(
        self,
        redis: aioredis.Redis,
        registry: CollectorRegistry,
        users: Collection[str],
        interval: float = 5.0,
    ) -> None:
        self._redis = redis
        self._users = frozenset(users)
        self.interval = interval
        self.refusals = Counter(
            "trellis_redis_refusals",
            "Commands Redis refused (INFO errorstats: NOAUTH, WRONGPASS, NOPERM), by error",
            ["error"],
            registry=registry,
        )
        self.denied = Counter(
            "trellis_redis_acl_denied",
            "Denials in Redis's ACL LOG, by ACL user (or 'other') and reason",
            ["user", "reason"],
            registry=registry,
        )
        self._run_id: str | None = None
        self._errors: dict[str, int] = {}
        self._entries: dict[EntryKey, int] = {}
        self.polls = 0  # reads completed (the first is the baseline)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.poll()
            except NoPermissionError as exc:
                log.error("redis.audit_refused error=%s action=stopped", exc)
                return
            except (RedisError, OSError, TimeoutError) as exc:
                log.warning("redis.audit_failed error=%s", f"{type(exc).__name__}: {exc}")
            await wait_or_stop(stop, self.interval)

    async def poll(self) -> None:
        """One read of both sources; the first one only sets the baseline."""
        async with asyncio.timeout(max(self.interval, 2.0)):
            info = await self._redis.info("server")
            stats = await self._redis.info("errorstats")
            entries = await self._redis.acl_log()
        errors = {
            code: int(stats.get(f"errorstat_{code}", {}).get("count", 0)) for code in REFUSAL_ERRORS
        }
        run_id = _text(info.get("run_id", ""))
        restarted = self._run_id is not None and (
            run_id != self._run_id or any(errors[c] < self._errors.get(c, 0) for c in errors)
        )
        if restarted:
            log.info("redis.audit_restarted run_id=%s", run_id)
            self._errors, self._entries = {}, {}
        baseline = self._run_id is None
        self._run_id = run_id
        self._count_errors(errors, baseline)
        self._count_entries(entries, baseline)
        if baseline:
            for code in REFUSAL_ERRORS:
                self.refusals.labels(code)  # present at 0 from now on
            log.info(
                "redis.audit_started interval=%s %s acl_log_entries=%d",
                self.interval,
                " ".join(f"{c.lower()}_before={n}" for c, n in errors.items()),
                len(entries),
            )
        self.polls += 1

    def _count_errors(self, errors: Mapping[str, int], baseline: bool) -> None:
        for code, total in errors.items():
            new = total - self._errors.get(code, 0)
            self._errors[code] = total
            if new > 0 and not baseline:
                self.refusals.labels(code).inc(new)
                log.warning("redis.refused error=%s count=%d", code, new)

    def _count_entries(self, entries: Sequence[Mapping[str, Any]], baseline: bool) -> None:
        # Only the entries Redis still holds are remembered: one that fell off the log and
        # comes back is new, and names sent by failed logins do not pile up here.
        previous, self._entries = self._entries, {}
        for entry in entries:
            key: EntryKey = (
                _text(entry.get("reason", "")),
                _text(entry.get("context", "")),
                _text(entry.get("object", "")),
                _text(entry.get("username", "")),
            )
            count = int(entry.get("count", 1))
            seen = previous.get(key, 0)
            new = count - seen if count >= seen else count  # smaller: an entry made anew
            self._entries[key] = count
            if new <= 0 or baseline:
                continue
            reason, context, what, user = key
            client = entry.get("client-info")
            client = client if isinstance(client, Mapping) else {}
            self.denied.labels(user if user in self._users else "other", reason).inc(new)
            log.warning(
                "redis.acl_denied user=%s reason=%s object=%s context=%s command=%s "
                "client=%s count=%d",
                user,
                reason,
                what,
                context,
                _text(client.get("cmd", "-")),
                _text(client.get("addr", "-")),
                new,
            )
