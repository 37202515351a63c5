#!/usr/bin/env bash
# Starts the local services the tests use when they are down (the commands of the go-svc
# machine page) and waits for them: PostgreSQL, Redis, RabbitMQ, MariaDB. Kafka needs no server (the
# tests run kfake in-process). Exits non-zero if a service stays unreachable.
set -uo pipefail

tcp_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_for() { # name, seconds, check command...
	local name=$1 secs=$2; shift 2
	for _ in $(seq 1 "$secs"); do
		if "$@" >/dev/null 2>&1; then echo "services: $name up"; return 0; fi
		sleep 1
	done
	echo "services: $name unreachable" >&2
	return 1
}

fail=0

if ! pg_isready -h 127.0.0.1 -p 5432 >/dev/null 2>&1; then
	echo "services: starting PostgreSQL"
	pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
fi
wait_for PostgreSQL 60 pg_isready -h 127.0.0.1 -p 5432 || fail=1

if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
	echo "services: starting Redis"
	mkdir -p /var/lib/redis /var/log/redis
	redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
		--dir /var/lib/redis --logfile /var/log/redis/ci.log || true
fi
wait_for Redis 30 redis-cli -h 127.0.0.1 -p 6379 ping || fail=1

if ! tcp_open 5672; then
	echo "services: starting RabbitMQ"
	rabbitmq-server -detached || true
fi
wait_for RabbitMQ 120 tcp_open 5672 || fail=1

mariadb_up() { mariadb-admin -h 127.0.0.1 -P 3306 -u root ping || mysqladmin -h 127.0.0.1 -P 3306 -u root ping; }
if ! mariadb_up >/dev/null 2>&1; then
	echo "services: starting MariaDB"
	start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd || true
fi
wait_for MariaDB 60 mariadb_up || fail=1

exit $fail
