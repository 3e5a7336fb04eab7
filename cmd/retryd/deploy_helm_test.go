package main

import (
	"bytes"
	"github.com/retryd/retryd/internal/servicetest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/natsconn"
)

const chartDir = deployDir + "/helm/retryd"

// helmTemplate renders the chart as release "retryd" with the given values
// files (relative to the chart) and decodes the objects. It needs the helm
// binary HELM names: scripts/lint installs the pinned one in bin/, and
// scripts/test points HELM at it (CI runs lint first).
func helmTemplate(t *testing.T, values ...string) []map[string]any {
	t.Helper()
	helm := os.Getenv("HELM")
	if _, err := os.Stat(helm); helm != "" && err != nil {
		helm = ""
	}
	servicetest.NeedTool(t, helm != "", "helm (HELM)", "run scripts/lint, which installs it in bin/, or set HELM")
	// The chart's minimum (Chart.yaml kubeVersion): helm built from its
	// module assumes 1.20 without a cluster.
	args := []string{"template", "retryd", chartDir, "--kube-version", "1.30.0"}
	for _, v := range values {
		args = append(args, "-f", filepath.Join(chartDir, v))
	}
	var stderr bytes.Buffer
	cmd := exec.Command(helm, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "helm %s: %s", strings.Join(args, " "), stderr.String())
	return decodeYAML(t, "helm template", out)
}

// byKind indexes rendered objects by kind and name.
func byKind(t *testing.T, docs []map[string]any) map[string]map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]map[string]any{}
	for _, doc := range docs {
		kind := doc["kind"].(string)
		if out[kind] == nil {
			out[kind] = map[string]map[string]any{}
		}
		out[kind][dig(t, doc, "metadata", "name").(string)] = doc
	}
	return out
}

// containerEnv indexes a container's env entries by name.
func containerEnv(t *testing.T, c any) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	env, _ := c.(map[string]any)["env"].([]any)
	for _, e := range env {
		m := e.(map[string]any)
		out[m["name"].(string)] = m
	}
	return out
}

// chartComponents are the chart's Deployments: the NATS user (none for
// the gateway), the port of RETRYD_HTTP_ADDR and the Postgres role.
var chartComponents = map[string]struct {
	natsUser string
	port     int
	role     string
}{
	"retryd-scheduler": {"scheduler", 8080, "retryd_scheduler"},
	"retryd-ingress":   {"ingress", 8081, "retryd_ingress"},
	"retryd-triggers":  {"triggers", 8082, "retryd_triggers"},
	"retryd-gateway":   {"", 8080, "retryd_readonly"},
}

// TestHelmChart renders deploy/helm/retryd with its default values (the
// secrets of deploy/k8s/secrets.example.yaml, in-cluster NATS) and with
// ci/external-values.yaml (an external Postgres and NATS, every optional
// object on), and checks what each component needs is there and that no
// secret is rendered.
func TestHelmChart(t *testing.T) {
	t.Parallel()
	secrets := map[string]map[string]any{}
	for _, doc := range readYAML(t, filepath.Join(deployDir, "k8s", "secrets.example.yaml")) {
		secrets[dig(t, doc, "metadata", "name").(string)] = dig(t, doc, "stringData").(map[string]any)
	}
	binaries := dockerBinaries(t)
	reads := readEnvironment(t)

	t.Run("default", func(t *testing.T) {
		t.Parallel()
		objs := byKind(t, helmTemplate(t))
		require.Empty(t, objs["Secret"], "secrets are referenced, never rendered")
		require.Len(t, objs["Deployment"], len(chartComponents))
		for name, dep := range objs["Deployment"] {
			// The default secretName of each component is its Secret in
			// secrets.example.yaml.
			checkDeployment(t, dep, name, secrets, binaries)
			checkChartDeployment(t, objs, name, reads)
			require.Equal(t, 2, dig(t, dep, "spec", "replicas"), name)
			require.Contains(t, objs["PodDisruptionBudget"], name)
		}
		require.Empty(t, objs["HorizontalPodAutoscaler"], "autoscaling is off by default")
		for _, kind := range []string{"ServiceMonitor", "PrometheusRule", "ConfigMap"} {
			require.Empty(t, objs[kind], "%s is off by default", kind)
		}
		job := objs["Job"]["retryd-setup"]
		require.NotNil(t, job, "the setup Job")
		checkSetupJob(t, job, binaries, reads)
		for _, c := range dig(t, job, "spec", "template", "spec", "containers").([]any) {
			require.Equal(t, "retryd-setup", dig(t, c, "envFrom").([]any)[0].(map[string]any)["secretRef"].(map[string]any)["name"])
		}
		require.Contains(t, secrets["retryd-setup"]["DATABASE_URL"], "retryd_owner", "migrations run as the owner")
		maintenance := checkMaintenanceCronJob(t, objs, reads)
		require.Equal(t, "retryd-setup", dig(t, maintenance, "envFrom").([]any)[0].(map[string]any)["secretRef"].(map[string]any)["name"],
			"maintenance runs as the owner, as the setup Job does")

		// Everything denied by default; only ingress's intake and the
		// gateway open to anyone.
		policies := objs["NetworkPolicy"]
		require.ElementsMatch(t, []string{"Ingress", "Egress"}, strs(t, dig(t, policies["retryd-default-deny"], "spec", "policyTypes")))
		require.NotContains(t, dig(t, policies["retryd-default-deny"], "spec"), "ingress")
		require.NotContains(t, dig(t, policies["retryd-default-deny"], "spec"), "egress")
		open := map[string]int{}
		for name, p := range policies {
			rules, _ := dig(t, p, "spec").(map[string]any)["ingress"].([]any)
			for _, r := range rules {
				if _, ok := r.(map[string]any)["from"]; !ok {
					require.Len(t, dig(t, r, "ports"), 1, name)
					open[dig(t, p, "spec", "podSelector", "matchLabels", "app.kubernetes.io/component").(string)] = dig(t, r, "ports").([]any)[0].(map[string]any)["port"].(int)
				}
			}
		}
		require.Equal(t, map[string]int{"ingress": 8081, "gateway": 8080}, open)
		// Ingress's operator port is the gateway's alone.
		fromGateway := dig(t, policies["retryd-from-gateway"], "spec")
		require.Contains(t, strs(t, dig(t, fromGateway, "podSelector", "matchExpressions").([]any)[0].(map[string]any)["values"]), "ingress")
		require.Contains(t, dig(t, fromGateway, "ingress").([]any)[0].(map[string]any)["ports"], map[string]any{"protocol": "TCP", "port": 8083})
	})

	t.Run("external", func(t *testing.T) {
		t.Parallel()
		objs := byKind(t, helmTemplate(t, "ci/external-values.yaml"))
		require.Empty(t, objs["Secret"], "secrets are referenced, never rendered")
		require.Len(t, objs["Deployment"], len(chartComponents))
		for name, dep := range objs["Deployment"] {
			checkChartDeployment(t, objs, name, reads)
			require.NotContains(t, dig(t, dep, "spec"), "replicas", "%s: the HPA sets the replicas", name)
			require.Equal(t, name, dig(t, objs["HorizontalPodAutoscaler"][name], "spec", "scaleTargetRef", "name"))
			c := dig(t, dep, "spec", "template", "spec", "containers").([]any)[0]
			checkDatabaseURL(t, containerEnv(t, c), chartComponents[name].role, name)
		}
		job := objs["Job"]["retryd-setup"]
		checkSetupJob(t, job, binaries, reads)
		migrate := dig(t, job, "spec", "template", "spec", "containers").([]any)[0]
		checkDatabaseURL(t, containerEnv(t, migrate), "retryd_owner", "migrate")
		checkDatabaseURL(t, containerEnv(t, checkMaintenanceCronJob(t, objs, reads)), "retryd_owner", "maintenance")

		require.Equal(t, "monitoring.coreos.com/v1", objs["ServiceMonitor"]["retryd"]["apiVersion"])
		require.Equal(t, "http", dig(t, objs["ServiceMonitor"]["retryd"], "spec", "endpoints").([]any)[0].(map[string]any)["port"])
		rules := readYAML(t, filepath.Join(monitoringDir, "prometheus", "retryd-rules.yaml"))[0]
		require.Equal(t, rules["groups"], dig(t, objs["PrometheusRule"]["retryd"], "spec", "groups"))
		dashboard, err := os.ReadFile(filepath.Join(monitoringDir, "grafana", "retryd.json"))
		require.NoError(t, err)
		require.Equal(t, strings.TrimSpace(string(dashboard)), dig(t, objs["ConfigMap"]["retryd-dashboard"], "data", "retryd.json"))
	})
}

// checkChartDeployment checks what the chart adds to checkDeployment's
// checks, and that no secret is in the object.
func checkChartDeployment(t *testing.T, objs map[string]map[string]map[string]any, name string, reads map[string]bool) {
	t.Helper()
	want, ok := chartComponents[name]
	require.True(t, ok, "unexpected Deployment %s", name)
	dep := objs["Deployment"][name]
	pod := dig(t, dep, "spec", "template", "spec")
	c := dig(t, pod, "containers").([]any)[0]
	checkLockedDown(t, pod, c, name)
	require.NotEmpty(t, dig(t, c, "resources", "requests", "cpu"), name)
	require.NotEmpty(t, dig(t, c, "resources", "requests", "memory"), name)
	require.NotEmpty(t, dig(t, c, "resources", "limits", "memory"), name)

	env := containerEnv(t, c)
	checkEnvNames(t, env, reads, name)
	require.Equal(t, want.port, dig(t, c, "ports").([]any)[0].(map[string]any)["containerPort"], name)
	require.Contains(t, dig(t, objs["Service"][name], "spec", "ports").([]any),
		map[string]any{"name": "http", "port": want.port, "targetPort": "http"}, name)
	if want.natsUser == "" {
		require.NotContains(t, env, natsconn.EnvURL, "%s has no NATS user", name)
		cmd := strings.Join(strs(t, dig(t, c, "command")), " ")
		for _, svc := range []string{"--scheduler http://retryd-scheduler:8080", "--ingress http://retryd-ingress:8081",
			"--ingress-operator http://retryd-ingress:8083", "--triggers http://retryd-triggers:8082"} {
			require.Contains(t, cmd, svc)
		}
		return
	}
	require.Equal(t, ":"+strconv.Itoa(want.port), env["RETRYD_HTTP_ADDR"]["value"], name)
	require.NotEmpty(t, env[natsconn.EnvURL]["value"], name)
	require.Equal(t, "_INBOX_"+want.natsUser, env[natsconn.EnvInboxPrefix]["value"], "%s reads its replies on its own inbox prefix", name)
	checkMounted(t, pod, c, env[natsconn.EnvTLSCA]["value"].(string), name)
	if creds, ok := env[natsconn.EnvCreds]; ok {
		checkMounted(t, pod, c, creds["value"].(string), name)
	}
	switch want.natsUser {
	case "scheduler":
		require.Equal(t, "3", env["RETRYD_SCHEDULER_STREAM_REPLICAS"]["value"])
		require.Equal(t, "metadata.name", dig(t, env["RETRYD_SCHEDULER_INSTANCE"], "valueFrom", "fieldRef", "fieldPath"))
	case "ingress":
		require.Equal(t, ":8083", env["RETRYD_OPERATOR_ADDR"]["value"])
		require.Equal(t, 8083, dig(t, c, "ports").([]any)[1].(map[string]any)["containerPort"])
	}
	if want.natsUser != "scheduler" {
		// The setup Job migrates and creates the streams at three
		// replicas; the service's role has no DDL.
		upper := strings.ToUpper(want.natsUser)
		require.Equal(t, "false", env["RETRYD_"+upper+"_MIGRATE"]["value"], name)
		require.Equal(t, "false", env["RETRYD_"+upper+"_ENSURE_STREAMS"]["value"], name)
	}
}

// checkSetupJob checks the Job that migrates and ensures the streams
// before each release's pods roll.
func checkSetupJob(t *testing.T, job map[string]any, binaries []string, reads map[string]bool) {
	t.Helper()
	require.Contains(t, dig(t, job, "metadata", "annotations", "helm.sh/hook"), "pre-upgrade")
	pod := dig(t, job, "spec", "template", "spec")
	var cmds []string
	for _, c := range dig(t, pod, "containers").([]any) {
		cmd := strs(t, dig(t, c, "command"))
		require.Contains(t, binaries, cmd[0])
		cmds = append(cmds, strings.Join(cmd, " "))
		checkLockedDown(t, pod, c, "setup")
		checkEnvNames(t, containerEnv(t, c), reads, "setup")
	}
	require.Len(t, cmds, 2)
	require.True(t, strings.HasPrefix(cmds[0], "retryd migrate --scheduler-role=retryd_scheduler"), cmds[0])
	require.Equal(t, "retryd --timeout 60s streams ensure --replicas 3", cmds[1])
}

// checkMaintenanceCronJob checks the CronJob that runs retention hourly
// (on by default) and returns its container.
func checkMaintenanceCronJob(t *testing.T, objs map[string]map[string]map[string]any, reads map[string]bool) any {
	t.Helper()
	cron := objs["CronJob"]["retryd-maintenance"]
	require.NotNil(t, cron, "the maintenance CronJob")
	require.Equal(t, "7 * * * *", dig(t, cron, "spec", "schedule"), "hourly")
	require.Equal(t, "Forbid", dig(t, cron, "spec", "concurrencyPolicy"))
	pod := dig(t, cron, "spec", "jobTemplate", "spec", "template", "spec")
	containers := dig(t, pod, "containers").([]any)
	require.Len(t, containers, 1)
	c := containers[0]
	require.Equal(t, []string{"retryd", "maintenance", "--history-retention=30d",
		"--retention=audit_log=365d", "--retention=jobs=30d", "--retention=retries=30d",
		"--retention=workflow_events=30d", "--retention=workflow_runs=30d", "--retention=workflow_trigger_deliveries=30d",
		"--ahead=7d"}, strs(t, dig(t, c, "command")))
	checkLockedDown(t, pod, c, "maintenance")
	env := containerEnv(t, c)
	checkEnvNames(t, env, reads, "maintenance")
	require.NotContains(t, env, natsconn.EnvURL, "maintenance needs no NATS")
	return c
}

// checkLockedDown: no API token, the image's unprivileged user, no
// privileges, a read-only root filesystem.
func checkLockedDown(t *testing.T, pod, c any, name string) {
	t.Helper()
	require.Equal(t, false, dig(t, pod, "automountServiceAccountToken"), name)
	require.Equal(t, true, dig(t, pod, "securityContext", "runAsNonRoot"), name)
	require.Equal(t, 65532, dig(t, pod, "securityContext", "runAsUser"), name)
	require.Equal(t, false, dig(t, c, "securityContext", "allowPrivilegeEscalation"), name)
	require.Equal(t, true, dig(t, c, "securityContext", "readOnlyRootFilesystem"), name)
	require.Equal(t, []string{"ALL"}, strs(t, dig(t, c, "securityContext", "capabilities", "drop")), name)
}

// secretEnv are the variables that hold a secret: never a literal value.
var secretEnv = regexp.MustCompile(`^(NATS_PASSWORD|NATS_TOKEN|RETRYD_ADMIN_TOKEN|PGPASSWORD)$`)

// checkEnvNames: each variable set is one a binary reads (or pgx's
// PGPASSWORD, or the OpenTelemetry SDK's), and none carries a secret.
func checkEnvNames(t *testing.T, env map[string]map[string]any, reads map[string]bool, name string) {
	t.Helper()
	for v, e := range env {
		if envName.MatchString(`"` + v + `"`) {
			require.True(t, reads[v], "%s sets %s, which no binary reads", name, v)
		} else {
			require.True(t, v == "PGPASSWORD" || strings.HasPrefix(v, "OTEL_"), "%s sets %s", name, v)
		}
		if secretEnv.MatchString(v) {
			require.NotContains(t, e, "value", "%s: %s comes from a Secret", name, v)
		}
	}
}

// checkDatabaseURL: with postgres.host, DATABASE_URL names the role and
// no password; the password comes from a Secret as PGPASSWORD.
func checkDatabaseURL(t *testing.T, env map[string]map[string]any, role, name string) {
	t.Helper()
	u, err := url.Parse(env["DATABASE_URL"]["value"].(string))
	require.NoError(t, err, name)
	require.Equal(t, role, u.User.Username(), name)
	_, hasPassword := u.User.Password()
	require.False(t, hasPassword, "%s: no password in DATABASE_URL", name)
	require.Equal(t, "verify-full", u.Query().Get("sslmode"), name)
	require.NotEmpty(t, dig(t, env["PGPASSWORD"], "valueFrom", "secretKeyRef", "name"), name)
}

// checkMounted: path lies in a volume mounted from a Secret.
func checkMounted(t *testing.T, pod, c any, path, name string) {
	t.Helper()
	volumes := map[string]any{}
	for _, v := range dig(t, pod, "volumes").([]any) {
		volumes[v.(map[string]any)["name"].(string)] = v
	}
	for _, m := range dig(t, c, "volumeMounts").([]any) {
		mount := m.(map[string]any)
		if strings.HasPrefix(path, mount["mountPath"].(string)+"/") {
			require.NotEmpty(t, dig(t, volumes[mount["name"].(string)], "secret", "secretName"), name)
			return
		}
	}
	t.Fatalf("%s: nothing is mounted at %s", name, path)
}

// TestHelmChartFiles keeps the chart's copies of deploy/monitoring's
// dashboard and rules equal to them (Helm reads files inside the chart
// only), and its appVersion the latest release of CHANGELOG.md.
func TestHelmChartFiles(t *testing.T) {
	t.Parallel()
	for copied, orig := range map[string]string{
		"files/retryd.json":       "grafana/retryd.json",
		"files/retryd-rules.yaml": "prometheus/retryd-rules.yaml",
	} {
		want, err := os.ReadFile(filepath.Join(monitoringDir, orig))
		require.NoError(t, err)
		got, err := os.ReadFile(filepath.Join(chartDir, copied))
		require.NoError(t, err)
		require.True(t, bytes.Equal(want, got), "%s differs from deploy/monitoring/%s: cp deploy/monitoring/%s deploy/helm/retryd/%s", copied, orig, orig, copied)
	}
	changelog, err := os.ReadFile("../../CHANGELOG.md")
	require.NoError(t, err)
	release := regexp.MustCompile(`(?m)^## (\d+\.\d+\.\d+) - `).FindSubmatch(changelog)
	require.NotNil(t, release, "CHANGELOG.md names a release")
	chart := readYAML(t, filepath.Join(chartDir, "Chart.yaml"))[0]
	require.Equal(t, string(release[1]), chart["appVersion"], "Chart.yaml's appVersion is the latest release")
}
