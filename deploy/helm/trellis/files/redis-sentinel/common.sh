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

# The value after the line "$1" in a --raw reply of field and value lines ("$2").
field() {
  printf '%s\n' "$2" | {
    found=""
    while IFS= read -r line; do
      if [ -n "$found" ]; then
        echo "$line"
        return
      fi
      if [ "$line" = "$1" ]; then found=1; fi
    done
  }
}

# Sentinel "$1"'s --raw answer to "sentinel $2 <master name>" (empty if none).
ask_sentinel() {
  REDISCLI_AUTH=$(password "$REDIS_SENTINEL_USER") timeout 3 redis-cli \
    -h "$(peer "$1")" -p "$SENTINEL_PORT" --user "$REDIS_SENTINEL_USER" --raw \
    sentinel "$2" "$REDIS_MASTER_NAME" 2>/dev/null || true
}

# The master the Sentinels name, by the newest configuration: every Sentinel is asked, and
# the answer of the highest config epoch wins. A failover raises the epoch, and a Sentinel
# that has not heard of it yet still names the old master: the one beside a master just
# killed hears last, and a restarted old master that took its word would start as a second
# master until the Sentinels turn it into a replica. The address is the one a component
# gets (get-master-addr-by-name: the failover's leader names the promoted replica as soon
# as it is promoted, at the new epoch, while the others still name the old master at the
# old one); at the same epoch another pod wins over this one. Pod 0 when none answers (the
# first start of the set; or all of them restarted at once, when pod 0, a replica until
# then, holds what it had replicated).
current_master() {
  best=""
  best_epoch=-1
  i=0
  while [ "$i" -lt "$REDIS_REPLICAS" ]; do
    epoch=$(field config-epoch "$(ask_sentinel "$i" master)")
    address=$(ask_sentinel "$i" get-master-addr-by-name | head -n 1)
    case "$address" in *" "*) address="" ;; esac # an error
    case "$epoch" in
      "" | *[!0-9]*) ;;  # no answer, or an error
      *)
        if [ -n "$address" ] && { [ "$epoch" -gt "$best_epoch" ] ||
          { [ "$epoch" -eq "$best_epoch" ] && [ "$best" = "$self" ]; }; }; then
          best=$address
          best_epoch=$epoch
        fi
        ;;
    esac
    i=$((i + 1))
  done
  if [ -n "$best" ]; then
    echo "$best"
  else
    peer 0
  fi
}
