#!/usr/bin/env bash
# with-services.sh CMD...: run CMD with the services it needs, starting the ones that are
# not given and stopping, afterwards, the ones this script started (nothing is left running
# that was not running before).
#   Postgres: DATABASE_URL if given, else the private cluster of scripts/postgres.sh.
#   TEST_DATABASE_URL defaults to the cluster's test database (or DATABASE_URL if given).
#   Docker: started when dockerd is installed and no engine answers (WITH_DOCKER=0 skips it);
#   without one, `dev` runs org processes locally and the Docker tests say why they skip.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

started=()
cleanup() {
	local s
	for s in "${started[@]}"; do "$here/$s.sh" stop || true; done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [ -z "${DATABASE_URL:-}" ]; then
	"$here/postgres.sh" status || started+=(postgres)
	DATABASE_URL=$("$here/postgres.sh" start)
	export TEST_DATABASE_URL=${TEST_DATABASE_URL:-$("$here/postgres.sh" url test)}
else
	export TEST_DATABASE_URL=${TEST_DATABASE_URL:-$DATABASE_URL}
fi
export DATABASE_URL

if [ "${WITH_DOCKER:-1}" != 0 ] && command -v dockerd >/dev/null; then
	if ! "$here/docker.sh" status; then
		started+=(docker)
		"$here/docker.sh" start || echo "with-services.sh: going on without Docker" >&2
	fi
fi

"$@"
