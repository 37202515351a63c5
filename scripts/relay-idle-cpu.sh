#!/usr/bin/env bash
# Measures what an idle `outbox relay` costs PostgreSQL: it migrates a fresh table, starts a
# relay on it (webhook destination on a closed loopback port: nothing is ever delivered) with
# --wake-probe PROBE, and sums the CPU time of the relay's database backends (found by
# application_name) from /proc/<pid>/stat over SECONDS; prints it as % of one core, then stops
# the relay and drops the table. Run it on the database machine, e.g.
#   go build -o /tmp/outbox ./cmd/outbox && OUTBOX=/tmp/outbox scripts/relay-idle-cpu.sh 5ms 60
#   OUTBOX=/tmp/outbox scripts/relay-idle-cpu.sh 0 60    # the probe off
set -euo pipefail
probe=${1:-5ms}
secs=${2:-60}
outbox=${OUTBOX:-outbox}
dsn=${OUTBOX_TEST_POSTGRES_DSN:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}
table="idle_cpu_$$"
"$outbox" migrate --db "$dsn" --table "$table" >/dev/null
"$outbox" relay --db "$dsn&application_name=$table" --table "$table" --to http://127.0.0.1:9/x \
	--allow-prefix 127.0.0.0/8 --wake-probe "$probe" 2>/dev/null &
relay=$!
trap 'kill $relay 2>/dev/null; wait $relay 2>/dev/null; psql -X -q "$dsn" -c "DROP TABLE IF EXISTS $table CASCADE"' EXIT
sleep 3
pids=$(psql -X -t -A "$dsn" -c "SELECT pid FROM pg_stat_activity WHERE application_name = '$table'")
ticks() {
	local sum=0 f
	for p in $pids; do
		read -ra f <"/proc/$p/stat"
		sum=$((sum + f[13] + f[14]))
	done
	echo "$sum"
}
a=$(ticks)
sleep "$secs"
b=$(ticks)
hz=$(getconf CLK_TCK)
echo "wake-probe=$probe backends=$(echo $pids | wc -w) seconds=$secs cpu=$(echo "scale=3; 100*($b-$a)/$hz/$secs" | bc)% of one core"
