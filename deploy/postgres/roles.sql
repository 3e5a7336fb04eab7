-- retryd's Postgres roles. Run once per database server as a superuser:
--
--   psql -v owner_password="$RETRYD_OWNER_PASSWORD" -v app_password="$RETRYD_APP_PASSWORD" \
--        -f deploy/postgres/roles.sql
--
-- retryd_owner owns the database and the schema: `retryd migrate` runs as it
-- and is the only role with DDL. retryd_app is what the services connect as:
-- it reads and writes rows and uses sequences, and cannot create, alter or
-- drop anything. The default privileges below give retryd_app the same
-- rights on every table and sequence a later migration creates.
--
-- Optional psql variables: db (default retryd), owner (retryd_owner),
-- app (retryd_app).

\set ON_ERROR_STOP on
\if :{?db}
\else
  \set db retryd
\endif
\if :{?owner}
\else
  \set owner retryd_owner
\endif
\if :{?app}
\else
  \set app retryd_app
\endif

CREATE ROLE :"owner" LOGIN PASSWORD :'owner_password';
CREATE ROLE :"app" LOGIN PASSWORD :'app_password' NOSUPERUSER NOCREATEDB NOCREATEROLE;
CREATE DATABASE :"db" OWNER :"owner";
-- Nobody but the owner may create in the database (schemas, temp tables).
REVOKE ALL ON DATABASE :"db" FROM PUBLIC;
GRANT CONNECT ON DATABASE :"db" TO :"app";

\connect :"db"

-- Postgres 15 gives the public schema to pg_database_owner (retryd_owner
-- here) and no CREATE to PUBLIC; say so explicitly for older servers.
ALTER SCHEMA public OWNER TO :"owner";
REVOKE ALL ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO :"app";

-- Objects the owner creates from now on (every migration).
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner" IN SCHEMA public
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO :"app";
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner" IN SCHEMA public
    GRANT USAGE ON SEQUENCES TO :"app";
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner" IN SCHEMA public
    GRANT EXECUTE ON FUNCTIONS TO :"app";

-- Objects that exist already (roles added to a migrated database).
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO :"app";
GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO :"app";
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO :"app";
