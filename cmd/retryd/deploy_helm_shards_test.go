package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestHelmChartShards renders ci/shards-values.yaml (three scheduler
// shards): each further shard is a Deployment of its own on its own
// database, every NATS component splits RETRIES the same way, and the
// setup Job and the maintenance CronJob reach every shard's database.
func TestHelmChartShards(t *testing.T) {
	t.Parallel()
	objs := byKind(t, helmTemplate(t, "ci/shards-values.yaml"))
	deps := objs["Deployment"]
	for _, name := range []string{"retryd-scheduler", "retryd-scheduler-1", "retryd-scheduler-2", "retryd-ingress", "retryd-triggers"} {
		require.Contains(t, deps, name)
		c := dig(t, deps[name], "spec", "template", "spec", "containers").([]any)[0]
		env := containerEnv(t, c)
		require.Equal(t, "3", env["RETRYD_SHARDS"]["value"], "%s splits RETRIES as the others do", name)
	}
	wantDB := map[string]string{
		"retryd-scheduler":   "@pg.example.com:5432/retryd?",
		"retryd-scheduler-1": "@pg-shard1.example.com:5432/retryd_shard1?",
		"retryd-scheduler-2": "@pg.example.com:5432/retryd_shard2?",
	}
	for name, db := range wantDB {
		c := dig(t, deps[name], "spec", "template", "spec", "containers").([]any)[0]
		env := containerEnv(t, c)
		require.Contains(t, env["DATABASE_URL"]["value"], db, name)
		require.Contains(t, env["DATABASE_URL"]["value"], "retryd_scheduler@", name)
		if name == "retryd-scheduler" {
			require.NotContains(t, env, "RETRYD_SHARD", "the home shard is shard 0, the default")
			require.Equal(t, "postgres://retryd_scheduler@pg-shard1.example.com:5432/retryd_shard1?sslmode=verify-full,"+
				"postgres://retryd_scheduler@pg.example.com:5432/retryd_shard2?sslmode=verify-full",
				env["RETRYD_SHARD_DATABASE_URLS"]["value"], "the home shard's jobs API acts on every shard")
			continue
		}
		require.Equal(t, strings.TrimPrefix(name, "retryd-scheduler-"), env["RETRYD_SHARD"]["value"], name)
		require.Contains(t, env["RETRYD_AUTH_DATABASE_URL"]["value"], "retryd_scheduler@pg.example.com:5432/retryd?",
			"%s checks tokens in the home shard's database", name)
		require.Equal(t, "false", env["RETRYD_JOBS"]["value"], "%s: the home shard hosts the jobs API", name)
		require.Equal(t, "false", env["RETRYD_DASHBOARD"]["value"], name)
		sel := dig(t, deps[name], "spec", "selector", "matchLabels", "app.kubernetes.io/component")
		require.Equal(t, strings.TrimPrefix(name, "retryd-"), sel, "a shard's pods are not the home shard's")
		require.Contains(t, objs["Service"], name)
	}

	// The gateway routes to every shard and counts every shard's retries,
	// each flag in shard order.
	gw := dig(t, deps["retryd-gateway"], "spec", "template", "spec", "containers").([]any)[0]
	cmd := strs(t, dig(t, gw, "command"))
	var schedulers, dbs []string
	for i := 0; i+1 < len(cmd); i++ {
		switch cmd[i] {
		case "--scheduler":
			schedulers = append(schedulers, cmd[i+1])
		case "--database-url":
			dbs = append(dbs, cmd[i+1])
		}
	}
	require.Equal(t, []string{"http://retryd-scheduler:8080", "http://retryd-scheduler-1:8080", "http://retryd-scheduler-2:8080"}, schedulers)
	require.Equal(t, []string{"$(DATABASE_URL)", "$(DATABASE_URL_SHARD_1)", "$(DATABASE_URL_SHARD_2)"}, dbs)
	gwEnv := containerEnv(t, gw)
	require.Contains(t, gwEnv["DATABASE_URL_SHARD_1"]["value"], "retryd_readonly@pg-shard1.example.com:5432/retryd_shard1?")

	var migrated []string
	for _, c := range dig(t, objs["Job"]["retryd-setup"], "spec", "template", "spec", "containers").([]any) {
		if env := containerEnv(t, c); env["DATABASE_URL"] != nil {
			migrated = append(migrated, env["DATABASE_URL"]["value"].(string))
		}
	}
	require.Len(t, migrated, 3, "the setup Job migrates every shard's database")
	require.Contains(t, migrated[1], "retryd_owner@pg-shard1.example.com:5432/retryd_shard1?")

	cron := objs["CronJob"]["retryd-maintenance"]
	require.NotNil(t, cron)
	containers := dig(t, cron, "spec", "jobTemplate", "spec", "template", "spec", "containers").([]any)
	require.Len(t, containers, 3, "retention runs on every shard's database")
	require.Contains(t, containerEnv(t, containers[2])["DATABASE_URL"]["value"], "retryd_owner@pg.example.com:5432/retryd_shard2?")

	nats := dig(t, objs["NetworkPolicy"]["retryd-egress-nats"], "spec", "podSelector", "matchExpressions").([]any)[0]
	require.Subset(t, strs(t, dig(t, nats, "values")), []string{"scheduler", "scheduler-1", "scheduler-2"})
}
