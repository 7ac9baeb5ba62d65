#!/bin/sh
# Before the Redis of a pod stops (templates/redis-sentinel.yaml, preStop; common.sh for
# the environment): if it is the master, hand over first. Its Sentinel is asked for a
# failover, and the script waits until a replica is master and no Sentinel names this pod
# any more (Sentinels hear of a failover from each other within a couple of seconds; a
# component that asked a late one would be sent here), so a rollout or a drain costs no
# down-after-milliseconds of refused writes, and a master that comes back empty (an
# emptyDir) is never the one the others follow. A replica stops at once.
set -eu
. /scripts/common.sh

secret=$(password "$REDIS_SENTINEL_USER")
role() {
  REDISCLI_AUTH=$secret timeout 3 redis-cli -p "$REDIS_PORT" --user "$REDIS_SENTINEL_USER" \
    --raw role 2>/dev/null | head -n 1
}
[ "$(role)" = "master" ] || exit 0
echo "redis.handover self=$self"
REDISCLI_AUTH=$secret timeout 3 redis-cli -h "$self" -p "$SENTINEL_PORT" \
  --user "$REDIS_SENTINEL_USER" sentinel failover "$REDIS_MASTER_NAME" || true
# whether a Sentinel that answers still names this pod the master
named_here() {
  i=0
  while [ "$i" -lt "$REDIS_REPLICAS" ]; do
    if [ "$(ask_sentinel "$i" get-master-addr-by-name | head -n 1)" = "$self" ]; then
      return 0
    fi
    i=$((i + 1))
  done
  return 1
}
tries=0
while [ "$tries" -lt 20 ] && { [ "$(current_master)" = "$self" ] || named_here; }; do
  tries=$((tries + 1))
  sleep 1
done
