#!/bin/sh
# Writes Redis' ACL users at the Redis pod's start (templates/redis.yaml, and redis.sh and
# sentinel.sh of files/redis-sentinel/), from rules the chart renders and the passwords of
# the users Secret. The hashing is here, not in the chart, so the rendered chart holds no
# value derived from a password: with redis.existingUsersSecret, `helm template` (Argo CD,
# Flux) renders the same bytes each time. The Redis image has sh and sha256sum.
#
# Usage: redis-acl.sh PASSWORDS RULES OUT [RULES OUT]... [-- COMMAND...]
#   PASSWORDS  a folder with one file per user, named as the user, holding its password
#   RULES      one user a line: its name, then its rules; the user `default` gets its
#              rules as they are and no password (it is off)
#   OUT        the file written (0600): `user <name> on #<sha256 of password> <rules>`
#   COMMAND    run in place of this script once the files are written (redis-server)
set -eu

passwords=$1
shift
umask 077
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do
  rules=$1
  out=${2:?redis-acl.sh: $rules has no output file after it}
  shift 2
  # written beside the target, then renamed: a reader never sees half a file
  partial="$out.partial"
  : >"$partial"
  while read -r name user_rules; do
    case "$name" in
      "" | "#"*) continue ;;
      default)
        printf 'user default %s\n' "$user_rules" >>"$partial"
        continue
        ;;
    esac
    if [ ! -s "$passwords/$name" ]; then
      echo "redis-acl.no-password user=$name file=$passwords/$name: the users Secret needs a key $name" >&2
      rm -f "$partial"
      exit 1
    fi
    # $(...) drops trailing newlines, as the components do when they read the same file
    password=$(cat "$passwords/$name")
    hash=$(printf '%s' "$password" | sha256sum | cut -d ' ' -f 1)
    printf 'user %s on #%s %s\n' "$name" "$hash" "$user_rules" >>"$partial"
  done <"$rules"
  mv "$partial" "$out"
done
if [ "$#" -gt 0 ]; then
  shift
  exec "$@"
fi
