#!/bin/sh
# docker-entrypoint-initdb.d hook of the postgres image: creates retryd's
# roles and database on the first start of an empty data volume. Every
# password is required: there are no defaults.
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
  -v owner_password="${RETRYD_OWNER_PASSWORD:?set RETRYD_OWNER_PASSWORD}" \
  -v scheduler_password="${RETRYD_SCHEDULER_PASSWORD:?set RETRYD_SCHEDULER_PASSWORD}" \
  -v ingress_password="${RETRYD_INGRESS_PASSWORD:?set RETRYD_INGRESS_PASSWORD}" \
  -v triggers_password="${RETRYD_TRIGGERS_PASSWORD:?set RETRYD_TRIGGERS_PASSWORD}" \
  -v readonly_password="${RETRYD_READONLY_PASSWORD:?set RETRYD_READONLY_PASSWORD}" \
  -f /retryd/roles.sql
