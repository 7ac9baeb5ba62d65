#!/bin/sh
# One Redis of the Sentinel StatefulSet (templates/redis-sentinel.yaml; common.sh for the
# environment). Its configuration is written at each start into an emptyDir (the Sentinels
# rewrite it at a failover): the ACL users (files/redis-acl.sh), the user a replica logs in to its master with,
# and the pod's stable name as the address the Sentinels and replicas know it by. It starts
# as a replica of the master the Sentinels name, or as the master when that is itself.
set -eu
. /scripts/common.sh

master=$(current_master)
umask 077
# the ACL users, each password as its SHA-256 (files/redis-acl.sh)
sh /etc/redis-acl/redis-acl.sh /etc/redis-passwords /etc/redis-acl/redis.rules /conf/users.acl
{
  echo "port $REDIS_PORT"
  echo "dir /data"
  echo "appendonly yes"
  echo "aclfile /conf/users.acl"
  echo "protected-mode no"
  echo "replica-announce-ip $self"
  echo "masteruser $REDIS_REPLICATION_USER"
  echo "masterauth $(password "$REDIS_REPLICATION_USER")"
  if [ "$master" != "$self" ]; then
    echo "replicaof $master $REDIS_PORT"
  fi
} >/conf/redis.conf
echo "redis.start self=$self master=$master"
exec redis-server /conf/redis.conf
