# Shared by redis.sh, sentinel.sh and prestop.sh (templates/redis-sentinel.yaml): the
# pods' stable names and the master the Sentinels know.
#
# Environment: POD_NAME, REDIS_SET (the StatefulSet), REDIS_HEADLESS (its headless
# Service's domain), REDIS_REPLICAS, REDIS_MASTER_NAME, REDIS_PORT, SENTINEL_PORT,
# REDIS_REPLICATION_USER, REDIS_SENTINEL_USER; the users' passwords are files in
# /etc/redis-users.

# Each pod is known by its name under the headless Service, which stays when its IP changes.
peer() {
  echo "$REDIS_SET-$1.$REDIS_HEADLESS"
}
self=$(peer "${POD_NAME##*-}")

password() {
  cat "/etc/redis-users/$1"
}

# The master the first Sentinel that answers names; pod 0 when none does (the first start
# of the set; or all of them restarted at once, when pod 0, a replica until then, holds
# what it had replicated).
current_master() {
  i=0
  while [ "$i" -lt "$REDIS_REPLICAS" ]; do
    answer=$(REDISCLI_AUTH=$(password "$REDIS_SENTINEL_USER") timeout 3 redis-cli \
      -h "$(peer "$i")" -p "$SENTINEL_PORT" --user "$REDIS_SENTINEL_USER" --raw \
      sentinel get-master-addr-by-name "$REDIS_MASTER_NAME" 2>/dev/null | head -n 1) || answer=""
    case "$answer" in
      "" | *ERR* | *NOPERM* | *NOAUTH* | *" "*) ;;
      *)
        echo "$answer"
        return
        ;;
    esac
    i=$((i + 1))
  done
  peer 0
}
