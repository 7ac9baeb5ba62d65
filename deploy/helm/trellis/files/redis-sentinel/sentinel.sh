#!/bin/sh
# The Sentinel beside one Redis of the StatefulSet (templates/redis-sentinel.yaml;
# common.sh for the environment). It monitors the master the other Sentinels name (pod 0
# at the first start), logs in to the Redis pods as the Sentinels' ACL user, and to the
# other Sentinels as the same user. Its own users (users.conf, written by redis-acl.sh from
# the ConfigMap trellis-redis-acl and the users Secret): the default user off, each
# component with its Redis password allowed only to ask where the master is.
set -eu
. /scripts/common.sh

master=$(current_master)
secret=$(password "$REDIS_SENTINEL_USER")
# a Sentinel refuses to start on a master whose name does not resolve yet (pod 0 not
# created): wait until it answers, a while, then let the container restart and ask again
tries=0
until REDISCLI_AUTH=$secret timeout 3 redis-cli -h "$master" -p "$REDIS_PORT" \
  --user "$REDIS_SENTINEL_USER" ping >/dev/null 2>&1; do
  tries=$((tries + 1))
  if [ "$tries" -ge 60 ]; then
    echo "sentinel.wait-master-failed master=$master" >&2
    exit 1
  fi
  sleep 1
done
umask 077
cat >/sentinel/sentinel.conf <<CONF
port $SENTINEL_PORT
dir /sentinel
sentinel resolve-hostnames yes
sentinel announce-hostnames yes
sentinel announce-ip $self
sentinel monitor $REDIS_MASTER_NAME $master $REDIS_PORT $SENTINEL_QUORUM
sentinel auth-user $REDIS_MASTER_NAME $REDIS_SENTINEL_USER
sentinel auth-pass $REDIS_MASTER_NAME $secret
sentinel down-after-milliseconds $REDIS_MASTER_NAME $SENTINEL_DOWN_AFTER_MS
sentinel failover-timeout $REDIS_MASTER_NAME $SENTINEL_FAILOVER_TIMEOUT_MS
sentinel parallel-syncs $REDIS_MASTER_NAME 1
sentinel sentinel-user $REDIS_SENTINEL_USER
sentinel sentinel-pass $secret
CONF
# its users, each password as its SHA-256 (files/redis-acl.sh)
sh /etc/redis-acl/redis-acl.sh /etc/redis-passwords /etc/redis-acl/sentinel.rules \
  /sentinel/users.conf
cat /sentinel/users.conf >>/sentinel/sentinel.conf
echo "sentinel.start self=$self master=$master"
exec redis-server /sentinel/sentinel.conf --sentinel
