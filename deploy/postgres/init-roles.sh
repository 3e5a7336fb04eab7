#!/bin/sh
# docker-entrypoint-initdb.d hook of the postgres image: creates retryd's
# roles and database on the first start of an empty data volume.
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
  -v owner_password="${RETRYD_OWNER_PASSWORD:?set RETRYD_OWNER_PASSWORD}" \
  -v app_password="${RETRYD_APP_PASSWORD:?set RETRYD_APP_PASSWORD}" \
  -f /retryd/roles.sql
