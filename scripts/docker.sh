#!/usr/bin/env bash
# docker.sh start|stop|status: the Docker engine that `make run` uses when it can and the
# runtime tests need. start launches dockerd (Debian's docker.io) in the background when no
# engine answers; stop ends only an engine this script started.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
run_dir="$repo/.run"
pidfile="$run_dir/dockerd.pid"

say() { echo "docker.sh: $*" >&2; }

running() { docker info >/dev/null 2>&1; }

start() {
	running && return 0
	command -v dockerd >/dev/null || { say "no dockerd here (apt-get install docker.io)"; return 1; }
	mkdir -p "$run_dir"
	say "starting dockerd"
	dockerd >"$run_dir/dockerd.log" 2>&1 &
	echo $! >"$pidfile"
	for _ in $(seq 1 120); do
		running && return 0
		kill -0 "$(cat "$pidfile")" 2>/dev/null || break
		sleep 0.5
	done
	say "dockerd did not come up:"; tail -n 20 "$run_dir/dockerd.log" >&2
	return 1
}

stop() {
	[ -f "$pidfile" ] || return 0
	local pid
	pid=$(cat "$pidfile")
	if kill -0 "$pid" 2>/dev/null; then
		say "stopping dockerd"
		kill "$pid"
		for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
	fi
	rm -f "$pidfile"
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status) running ;;
*) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
