package main

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/retryd/retryd/internal/natsconn"
)

const deployDir = "../../deploy"

// readYAML decodes every document of a YAML file.
func readYAML(t *testing.T, path string) []map[string]any {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	return decodeYAML(t, path, raw)
}

// decodeYAML decodes every document of raw, read from where; empty
// documents are left out.
func decodeYAML(t *testing.T, where string, raw []byte) []map[string]any {
	t.Helper()
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	var docs []map[string]any
	for {
		var doc map[string]any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, where)
		if doc != nil {
			docs = append(docs, doc)
		}
	}
	return docs
}

// dig walks nested maps by keys.
func dig(t *testing.T, v any, keys ...string) any {
	t.Helper()
	for _, k := range keys {
		m, ok := v.(map[string]any)
		require.True(t, ok, "%v is not a map (looking for %q)", v, k)
		v, ok = m[k]
		require.True(t, ok, "no key %q in %v", k, keysOf(m))
	}
	return v
}

func keysOf(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func strs(t *testing.T, v any) []string {
	t.Helper()
	list, ok := v.([]any)
	require.True(t, ok, "%v is not a list", v)
	out := make([]string, len(list))
	for i, x := range list {
		out[i] = x.(string)
	}
	return out
}

// envVars finds ${VAR...} references in s.
var envRef = regexp.MustCompile(`\$\{([A-Z_]+)`)

func TestComposeFile(t *testing.T) {
	t.Parallel()
	docs := readYAML(t, filepath.Join(deployDir, "docker-compose.yml"))
	require.Len(t, docs, 1)
	services := dig(t, docs[0], "services").(map[string]any)
	require.ElementsMatch(t, []string{"postgres", "certs", "nats", "migrate", "streams", "scheduler", "ingress", "triggers", "gateway"}, keysOf(services))
	require.Equal(t, "postgres:15", dig(t, services, "postgres", "image"))
	require.Equal(t, "nats:2.12", dig(t, services, "nats", "image"))
	require.Equal(t, []string{"-c", "/etc/nats/nats-server.conf"}, strs(t, dig(t, services, "nats", "command")))

	// Files mounted from the repository exist.
	for _, name := range []string{"postgres", "nats"} {
		for _, v := range strs(t, dig(t, services, name, "volumes")) {
			if src, _, ok := strings.Cut(v, ":"); ok && strings.HasPrefix(src, "./") {
				_, err := os.Stat(filepath.Join(deployDir, src))
				require.NoError(t, err, "volume %s of %s", v, name)
			}
		}
	}
	// The image is built from deploy/Dockerfile with the repository as context.
	// Streams are created and changed by the NATS admin, before the
	// services, whose users may not change a stream.
	require.Equal(t, []string{"retryd", "--timeout", "60s", "streams", "ensure"}, strs(t, dig(t, services, "streams", "command")))
	require.Equal(t, "admin", dig(t, services, "streams", "environment", "NATS_USER"))
	for _, name := range []string{"certs", "migrate", "streams", "scheduler", "ingress", "triggers", "gateway"} {
		require.Equal(t, "retryd:dev", dig(t, services, name, "image"), name)
		require.Equal(t, "deploy/Dockerfile", dig(t, services, name, "build", "dockerfile"), name)
		require.Equal(t, "..", dig(t, services, name, "build", "context"), name)
	}

	// Migrations run once as the owner (who grants the service roles);
	// each service connects as its own Postgres role after they
	// succeeded, and as its own NATS user over TLS.
	require.Equal(t, []string{"retryd", "migrate"}, strs(t, dig(t, services, "migrate", "command")))
	require.Contains(t, dig(t, services, "migrate", "environment", "DATABASE_URL"), "postgres://retryd_owner:")
	ports := map[string]string{"scheduler": ":8080", "ingress": ":8081", "triggers": ":8082"}
	binaries := dockerBinaries(t)
	for name, addr := range ports {
		svc := services[name]
		cmd := strs(t, dig(t, svc, "command"))
		require.Equal(t, []string{"retryd-" + name}, cmd)
		require.Contains(t, binaries, cmd[0])
		env := dig(t, svc, "environment").(map[string]any)
		require.Equal(t, name, env["NATS_USER"], name)
		require.Equal(t, "_INBOX_"+name, env[natsconn.EnvInboxPrefix], "%s reads its replies on its own inbox prefix", name)
		require.Equal(t, "tls://nats:4222", env[natsconn.EnvURL], name)
		require.Equal(t, "/etc/retryd/tls/ca.crt", env[natsconn.EnvTLSCA], name)
		require.Contains(t, env["DATABASE_URL"], "postgres://retryd_"+name+":${RETRYD_"+strings.ToUpper(name)+"_PASSWORD:?", name)
		require.Equal(t, addr, env["RETRYD_HTTP_ADDR"], name)
		require.Equal(t, "service_completed_successfully", dig(t, svc, "depends_on", "migrate", "condition"), name)
		require.Equal(t, "service_completed_successfully", dig(t, svc, "depends_on", "streams", "condition"), name)
		require.Equal(t, []string{"CMD", "retryd", "probe", "http://127.0.0.1" + addr + "/readyz"}, strs(t, dig(t, svc, "healthcheck", "test")), name)
		require.Contains(t, strs(t, dig(t, svc, "volumes")), "nats-tls:/etc/retryd/tls:ro", name)
	}
	require.Equal(t, "false", dig(t, services, "ingress", "environment", "RETRYD_INGRESS_MIGRATE"))
	require.Equal(t, "false", dig(t, services, "triggers", "environment", "RETRYD_TRIGGERS_MIGRATE"))
	gw := strings.Join(strs(t, dig(t, services, "gateway", "command")), " ")
	for name, addr := range ports {
		require.Contains(t, gw, "--"+name+" http://"+name+addr)
	}
	// Ingress's operator API has its own, unpublished port, which the
	// gateway reaches; the published 8081 serves intake alone.
	require.Equal(t, ":8083", dig(t, services, "ingress", "environment", "RETRYD_OPERATOR_ADDR"))
	require.Contains(t, gw, "--ingress-operator http://ingress:8083")
	require.Equal(t, []string{"${RETRYD_BIND:-127.0.0.1}:8081:8081"}, strs(t, dig(t, services, "ingress", "ports")))

	// Every NATS password the server reads is given to it, and every
	// service's password is the one the server has for its user.
	natsEnv := dig(t, services, "nats", "environment").(map[string]any)
	conf, err := os.ReadFile(natsConfPath)
	require.NoError(t, err)
	for user, env := range natsUsers {
		require.Contains(t, string(conf), "$"+env, user)
		require.Contains(t, natsEnv, env)
		if svc, ok := services[user]; ok {
			want := envRef.FindStringSubmatch(natsEnv[env].(string))[1]
			got := envRef.FindStringSubmatch(dig(t, svc, "environment", "NATS_PASSWORD").(string))[1]
			require.Equal(t, want, got, user)
		}
	}
	require.Equal(t, []string{"retryd", "dev-certs", "--dir", "/tls", "--hosts", "nats,localhost,127.0.0.1", "--keep"}, strs(t, dig(t, services, "certs", "command")))
	// The gateway counts retries with the read-only role.
	require.Contains(t, dig(t, services, "gateway", "environment", "DATABASE_URL"), "postgres://retryd_readonly:${RETRYD_READONLY_PASSWORD:?")

	// Safe defaults: no password has a default (compose refuses to start
	// without each one), ports are published on 127.0.0.1 unless
	// RETRYD_BIND says otherwise, and the unauthenticated NATS monitoring
	// port is not published at all.
	raw, err := os.ReadFile(filepath.Join(deployDir, "docker-compose.yml"))
	require.NoError(t, err)
	for _, m := range regexp.MustCompile(`\$\{([A-Z_]+)(:?[-?])?`).FindAllStringSubmatch(string(raw), -1) {
		if m[1] == "RETRYD_BIND" {
			require.Equal(t, ":-", m[2])
			continue
		}
		require.Equal(t, ":?", m[2], "${%s} is required, with no default", m[1])
	}
	pgEnv := dig(t, services, "postgres", "environment").(map[string]any)
	initRoles, err := os.ReadFile(filepath.Join(deployDir, "postgres", "init-roles.sh"))
	require.NoError(t, err)
	for _, v := range regexp.MustCompile(`\$\{(RETRYD_[A-Z_]+_PASSWORD):\?`).FindAllStringSubmatch(string(initRoles), -1) {
		require.Contains(t, pgEnv, v[1], "init-roles.sh reads %s", v[1])
	}
	published := 0
	for name, svc := range services {
		ports, ok := svc.(map[string]any)["ports"]
		if !ok {
			continue
		}
		for _, p := range strs(t, ports) {
			require.True(t, strings.HasPrefix(p, "${RETRYD_BIND:-127.0.0.1}:"), "%s publishes %s on every interface", name, p)
			require.NotContains(t, p, "8222", "%s: the monitoring port is not published", name)
			published++
		}
	}
	require.Equal(t, 3, published, "NATS, ingress's intake and the gateway")
}

// dockerBinaries lists the binaries deploy/Dockerfile builds.
func dockerBinaries(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(deployDir, "Dockerfile"))
	require.NoError(t, err)
	var out []string
	for _, m := range regexp.MustCompile(`\./(?:services/\w+/)?cmd/([\w-]+)`).FindAllStringSubmatch(string(raw), -1) {
		out = append(out, m[1])
		_, err := os.Stat(filepath.Join("../..", strings.TrimPrefix(m[0], "./")))
		require.NoError(t, err, "Dockerfile builds %s", m[0])
	}
	require.ElementsMatch(t, []string{"retryd-scheduler", "retryd-ingress", "retryd-triggers", "retryd"}, out)
	return out
}

// TestHelmValuesMatchNATSConfig checks that the Kubernetes NATS cluster
// gets the same users and permissions as the compose server.
// Not parallel: loading the config sets environment variables.
func TestHelmValuesMatchNATSConfig(t *testing.T) {
	opts, _ := loadNATSConfig(t)
	docs := readYAML(t, filepath.Join(deployDir, "k8s", "nats-values.yaml"))
	require.Len(t, docs, 1)
	values := docs[0]
	require.Equal(t, true, dig(t, values, "config", "cluster", "enabled"))
	require.Equal(t, 3, dig(t, values, "config", "cluster", "replicas"))
	require.Equal(t, true, dig(t, values, "config", "jetstream", "enabled"))
	require.Equal(t, "always", dig(t, values, "config", "jetstream", "merge", "sync_interval"))
	require.Equal(t, true, dig(t, values, "config", "nats", "tls", "enabled"))
	require.Equal(t, "SYS", dig(t, values, "config", "merge", "system_account"))

	env := dig(t, values, "container", "env").(map[string]any)
	helmUsers := map[string]map[string]any{}
	for _, account := range []string{"SYS", "RETRYD"} {
		for _, u := range dig(t, values, "config", "merge", "accounts", account, "users").([]any) {
			um := u.(map[string]any)
			helmUsers[um["user"].(string)] = um
		}
	}
	require.Len(t, helmUsers, len(opts.Users))
	for _, u := range opts.Users {
		hu, ok := helmUsers[u.Username]
		require.True(t, ok, "user %s is in the Helm values", u.Username)
		require.Equal(t, "<< $"+natsUsers[u.Username]+" >>", hu["password"], u.Username)
		require.Contains(t, env, natsUsers[u.Username])
		if u.Permissions == nil {
			require.NotContains(t, hu, "permissions", u.Username)
			continue
		}
		pub := strs(t, dig(t, hu, "permissions", "publish", "allow"))
		sub := strs(t, dig(t, hu, "permissions", "subscribe", "allow"))
		require.Equal(t, sorted(u.Permissions.Publish.Allow), sorted(pub), "publish permissions of %s", u.Username)
		require.Equal(t, sorted(u.Permissions.Subscribe.Allow), sorted(sub), "subscribe permissions of %s", u.Username)
		if len(u.Permissions.Publish.Deny) > 0 {
			deny := strs(t, dig(t, hu, "permissions", "publish", "deny"))
			require.Equal(t, sorted(u.Permissions.Publish.Deny), sorted(deny), "publish denials of %s", u.Username)
		} else {
			require.NotContains(t, dig(t, hu, "permissions", "publish"), "deny", u.Username)
		}
	}
}

func sorted(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

// checkDeployment checks a Deployment of the Helm chart against the
// Secret of deploy/k8s/secrets.example.yaml it reads.
func checkDeployment(t *testing.T, doc map[string]any, name string, secrets map[string]map[string]any, binaries []string) {
	t.Helper()
	pod := dig(t, doc, "spec", "template", "spec")
	require.GreaterOrEqual(t, dig(t, pod, "terminationGracePeriodSeconds"), 35, "%s: longer than the services' 30s stop", name)
	require.Equal(t, true, dig(t, pod, "securityContext", "runAsNonRoot"), name)
	require.Equal(t, false, dig(t, pod, "automountServiceAccountToken"), "%s: no Kubernetes API token in the pod", name)
	containers := dig(t, pod, "containers").([]any)
	require.Len(t, containers, 1, name)
	c := containers[0]
	cmd := strs(t, dig(t, c, "command"))
	require.Contains(t, binaries, cmd[0], name)
	port := dig(t, c, "ports").([]any)[0]
	require.Equal(t, "http", dig(t, port, "name"), name)
	for probe, path := range map[string]string{"readinessProbe": "/readyz", "livenessProbe": "/healthz", "startupProbe": "/healthz"} {
		require.Equal(t, path, dig(t, c, probe, "httpGet", "path"), "%s %s", name, probe)
		require.Equal(t, "http", dig(t, c, probe, "httpGet", "port"), "%s %s", name, probe)
	}
	var secretRef string
	for _, ef := range dig(t, c, "envFrom").([]any) {
		if m, ok := ef.(map[string]any)["secretRef"]; ok {
			secretRef = m.(map[string]any)["name"].(string)
		}
	}
	require.Equal(t, name, secretRef, "%s takes its env from its own Secret", name)
	require.Contains(t, secrets, name, "secrets.example.yaml has %s", name)
	if user, ok := secrets[name]["NATS_USER"]; ok {
		require.Equal(t, strings.TrimPrefix(name, "retryd-"), user, name)
		require.Equal(t, "_INBOX_"+user.(string), secrets[name][natsconn.EnvInboxPrefix], "%s reads its replies on its own inbox prefix", name)
		require.Contains(t, secrets[name]["DATABASE_URL"], "postgres://retryd_"+user.(string)+":", "%s connects as its own role", name)
	} else {
		require.Contains(t, secrets[name]["DATABASE_URL"], "postgres://retryd_readonly:", "%s counts with the read-only role", name)
	}
	require.Equal(t, false, dig(t, c, "securityContext", "allowPrivilegeEscalation"), name)
	require.Equal(t, true, dig(t, c, "securityContext", "readOnlyRootFilesystem"), name)
}

// TestOperationsDocCoversEnvironment keeps docs/operations.md's
// configuration reference complete: every variable a service binary or
// internal/natsconn reads is documented.
func TestOperationsDocCoversEnvironment(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/operations.md")
	require.NoError(t, err)
	for v := range readEnvironment(t) {
		require.Contains(t, string(doc), "`"+v+"`", "docs/operations.md documents %s", v)
	}
}

// readEnvironment lists the variables a service binary, the packages
// configuring them (natsconn, auth, serve, daemon) or the CLI's root
// reads: each RETRYD_, NATS_ and DATABASE_ name quoted in their sources.
func readEnvironment(t *testing.T) map[string]bool {
	t.Helper()
	mains, err := filepath.Glob("../../services/*/cmd/*/main.go")
	require.NoError(t, err)
	require.Len(t, mains, 3)
	vars := map[string]bool{}
	for _, f := range append(mains, "../../internal/natsconn/natsconn.go", "../../internal/auth/config.go", "../../internal/serve/tls.go", "../../internal/daemon/daemon.go", "root.go") {
		src, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, m := range envName.FindAllStringSubmatch(string(src), -1) {
			vars[m[1]] = true
		}
	}
	require.Contains(t, vars, "RETRYD_SCHEDULER_BATCH_SIZE", "the variables are found")
	return vars
}

var envName = regexp.MustCompile(`"((?:RETRYD|NATS|DATABASE)_[A-Z_]+)"`)
