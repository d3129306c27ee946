#!/usr/bin/env bash
# postgres.sh start|stop|status|url [test]: the local Postgres that `make run` and
# `make test` use when DATABASE_URL is not given. A private cluster under .pgdata/ (git-ignored),
# created with initdb as the postgres user, listening on 127.0.0.1 only.
#   start    start it if needed (create cluster, role, databases); print the DATABASE_URL
#   stop     stop it if it is running
#   status   exit 0 when it is running
#   url      print the DATABASE_URL (url test: the test database's)
# Idempotent, and quiet when all is already up: only the URL goes to stdout.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
port=${HERMES_PG_PORT:-54329}
user=hermes
password=hermes

say() { echo "postgres.sh: $*" >&2; }

pg_bin() {
	local d
	d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
	if [ -n "$d" ] && [ -x "$d/initdb" ]; then echo "$d"; return; fi
	d=$(dirname "$(command -v initdb 2>/dev/null || echo /nonexistent/initdb)")
	[ -x "$d/initdb" ] || { say "no Postgres server binaries found (apt-get install postgresql)"; exit 1; }
	echo "$d"
}

# as_owner runs a command as the cluster owner: postgres when we are root.
as_owner() {
	if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

# The data folder must be reachable by the postgres user; a checkout under a private home
# folder is not, so fall back to a folder of our own under /var/tmp.
data_dir() {
	local d="$repo/.pgdata"
	if [ "$(id -u)" = 0 ] && ! runuser -u postgres -- test -x "$repo"; then
		d="/var/tmp/hermes-host-pg-$(echo "$repo" | md5sum | cut -c1-12)"
	fi
	echo "$d"
}

url() {
	local db=hermes
	[ "${1:-}" = test ] && db=hermes_test
	echo "postgres://$user:$password@127.0.0.1:$port/$db?sslmode=disable"
}

running() {
	local dir bin
	dir=$(data_dir); bin=$(pg_bin)
	[ -f "$dir/PG_VERSION" ] && as_owner "$bin/pg_ctl" -D "$dir" status >/dev/null 2>&1
}

psql_su() {
	local dir
	dir=$(data_dir)
	as_owner psql -X -q -v ON_ERROR_STOP=1 -h "$dir" -p "$port" -d postgres -tA "$@"
}

start() {
	local dir bin
	dir=$(data_dir); bin=$(pg_bin)
	if ! [ -f "$dir/PG_VERSION" ]; then
		say "creating a private cluster in $dir"
		mkdir -p "$dir"
		[ "$(id -u)" = 0 ] && chown postgres:postgres "$dir"
		chmod 700 "$dir"
		as_owner "$bin/initdb" -D "$dir" -U postgres --auth-local=peer --auth-host=scram-sha-256 \
			-E UTF8 --locale=C.UTF-8 >"$dir.initdb.log" 2>&1 || { cat "$dir.initdb.log" >&2; exit 1; }
		rm -f "$dir.initdb.log"
	fi
	if ! running; then
		say "starting Postgres on 127.0.0.1:$port"
		as_owner "$bin/pg_ctl" -D "$dir" -l "$dir/server.log" -w -t 60 \
			-o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c max_connections=300 -c fsync=on" start >/dev/null \
			|| { tail -n 20 "$dir/server.log" >&2; exit 1; }
	fi
	if [ "$(psql_su -c "SELECT 1 FROM pg_roles WHERE rolname = '$user'")" != 1 ]; then
		psql_su -c "CREATE ROLE $user LOGIN CREATEDB PASSWORD '$password'"
	fi
	for db in hermes hermes_test; do
		if [ "$(psql_su -c "SELECT 1 FROM pg_database WHERE datname = '$db'")" != 1 ]; then
			psql_su -c "CREATE DATABASE $db OWNER $user"
		fi
	done
	url
}

stop() {
	local dir bin
	dir=$(data_dir); bin=$(pg_bin)
	if running; then
		say "stopping Postgres on 127.0.0.1:$port"
		as_owner "$bin/pg_ctl" -D "$dir" -m fast -w stop >/dev/null
	fi
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status) running ;;
url) url "${2:-}" ;;
*) echo "usage: $0 start|stop|status|url [test]" >&2; exit 2 ;;
esac
