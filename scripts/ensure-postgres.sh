#!/usr/bin/env bash
# Start the local PostgreSQL cluster if it is down (the tests use 127.0.0.1:5432, db "test").
set -euo pipefail
if pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then exit 0; fi
if command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ]; then
  echo "starting PostgreSQL" >&2
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
  for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && exit 0; sleep 1; done
fi
echo "PostgreSQL is not reachable on 127.0.0.1:5432 and could not be started here" >&2
exit 1
