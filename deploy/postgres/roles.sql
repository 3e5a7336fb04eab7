-- retryd's Postgres roles. Run once per database server as a superuser,
-- before the first `retryd migrate`:
--
--   psql -v owner_password="$RETRYD_OWNER_PASSWORD" \
--        -v scheduler_password="$RETRYD_SCHEDULER_PASSWORD" \
--        -v ingress_password="$RETRYD_INGRESS_PASSWORD" \
--        -v triggers_password="$RETRYD_TRIGGERS_PASSWORD" \
--        -v readonly_password="$RETRYD_READONLY_PASSWORD" \
--        -f deploy/postgres/roles.sql
--
-- retryd_owner owns the database and the schema and is the only role with
-- DDL: `retryd migrate` and `retryd maintenance` (retention: creating and
-- dropping partitions) run as it. Each service connects as its own role,
-- which can neither create, alter nor drop anything, nor touch the tables
-- of another service:
--
--   retryd_scheduler  retryd-scheduler (with the jobs projection and API)
--   retryd_ingress    retryd-ingress
--   retryd_triggers   retryd-triggers
--   retryd_readonly   retryd gateway: SELECT on retries, for the dashboard
--
-- This file creates the roles only. The table grants are given by
-- `retryd migrate` after it applied the schema (migrations.Grant: the list
-- of tables per service lives next to the migrations, so a new table and
-- its grant ship together); it grants only the roles that exist and may
-- run any number of times. Created the roles after migrating? Run
-- `retryd migrate` again.
--
-- Optional psql variables: db (default retryd), owner (retryd_owner),
-- scheduler, ingress, triggers, readonly (the role names above; pass the same
-- names to `retryd migrate --scheduler-role ...`), and app_password: creates the
-- former single runtime role retryd_app (name: app) with data rights on
-- every table, for deployments not yet split per service. Leave it unset
-- otherwise: a role that can write every table is what this file avoids.

\set ON_ERROR_STOP on
\if :{?db}
\else
  \set db retryd
\endif
\if :{?owner}
\else
  \set owner retryd_owner
\endif
\if :{?scheduler}
\else
  \set scheduler retryd_scheduler
\endif
\if :{?ingress}
\else
  \set ingress retryd_ingress
\endif
\if :{?triggers}
\else
  \set triggers retryd_triggers
\endif
\if :{?readonly}
\else
  \set readonly retryd_readonly
\endif
\if :{?app}
\else
  \set app retryd_app
\endif

CREATE ROLE :"owner" LOGIN PASSWORD :'owner_password';
CREATE DATABASE :"db" OWNER :"owner";
-- Nobody but the owner may create in the database (schemas, temp tables).
REVOKE ALL ON DATABASE :"db" FROM PUBLIC;

\connect :"db"

-- Postgres 15 gives the public schema to pg_database_owner (retryd_owner
-- here) and no CREATE to PUBLIC; say so explicitly for older servers.
ALTER SCHEMA public OWNER TO :"owner";
REVOKE ALL ON SCHEMA public FROM PUBLIC;

-- A service role is created when its password is given (init-roles.sh
-- requires all four).
\if :{?scheduler_password}
  CREATE ROLE :"scheduler" LOGIN PASSWORD :'scheduler_password' NOSUPERUSER NOCREATEDB NOCREATEROLE;
  GRANT CONNECT ON DATABASE :"db" TO :"scheduler";
  GRANT USAGE ON SCHEMA public TO :"scheduler";
  -- `retryd-scheduler rebuild` keeps the message ids it has folded in a
  -- session table, dropped when it ends.
  GRANT TEMPORARY ON DATABASE :"db" TO :"scheduler";
\endif
\if :{?ingress_password}
  CREATE ROLE :"ingress" LOGIN PASSWORD :'ingress_password' NOSUPERUSER NOCREATEDB NOCREATEROLE;
  GRANT CONNECT ON DATABASE :"db" TO :"ingress";
  GRANT USAGE ON SCHEMA public TO :"ingress";
\endif
\if :{?triggers_password}
  CREATE ROLE :"triggers" LOGIN PASSWORD :'triggers_password' NOSUPERUSER NOCREATEDB NOCREATEROLE;
  GRANT CONNECT ON DATABASE :"db" TO :"triggers";
  GRANT USAGE ON SCHEMA public TO :"triggers";
\endif
\if :{?readonly_password}
  CREATE ROLE :"readonly" LOGIN PASSWORD :'readonly_password' NOSUPERUSER NOCREATEDB NOCREATEROLE;
  GRANT CONNECT ON DATABASE :"db" TO :"readonly";
  GRANT USAGE ON SCHEMA public TO :"readonly";
\endif

\if :{?app_password}
  CREATE ROLE :"app" LOGIN PASSWORD :'app_password' NOSUPERUSER NOCREATEDB NOCREATEROLE;
  GRANT CONNECT ON DATABASE :"db" TO :"app";
  GRANT USAGE ON SCHEMA public TO :"app";
  -- Objects the owner creates from now on (every migration).
  ALTER DEFAULT PRIVILEGES FOR ROLE :"owner" IN SCHEMA public
      GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO :"app";
  ALTER DEFAULT PRIVILEGES FOR ROLE :"owner" IN SCHEMA public
      GRANT USAGE ON SEQUENCES TO :"app";
  -- Objects that exist already (roles added to a migrated database).
  GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO :"app";
  GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO :"app";
\endif
