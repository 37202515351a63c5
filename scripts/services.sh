#!/usr/bin/env bash
# Starts the local services the tests use when they are down (commands from the go-svc machine
# page) and waits for them. Exits non-zero if one stays unreachable.
set -uo pipefail

wait_for() { # name, check command
	local name=$1; shift
	for _ in $(seq 1 60); do
		if "$@" >/dev/null 2>&1; then echo "services: $name up"; return 0; fi
		sleep 1
	done
	echo "services: $name unreachable" >&2
	return 1
}

tcp_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

fail=0
if ! pg_isready -h 127.0.0.1 -p 5432 >/dev/null 2>&1; then
	echo "services: starting PostgreSQL"
	pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
fi
wait_for PostgreSQL pg_isready -h 127.0.0.1 -p 5432 || fail=1

exit $fail
