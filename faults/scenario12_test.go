package faults_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/faults/harness"
	"github.com/retryd/retryd/internal/freeaddr"
	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/migrations"
)

// deployFile is a file of the deploy directory (the module sits at
// <repo>/faults).
func deployFile(t *testing.T, rel string) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(wd, "..", "deploy", rel)
}

// natsUsers are the users of deploy/nats/nats-server.conf whose passwords
// come from <USER>_NATS_PASSWORD.
var natsUsers = []string{"scheduler", "ingress", "triggers", "worker", "producer", "runner", "operator", "admin", "sys"}

// Scenario 12: the deploy configuration refuses what it must. With
// deploy/nats/nats-server.conf as shipped (only its paths and ports moved
// to the test's), an anonymous client is refused and each service user is
// refused subjects outside its permissions; with deploy/postgres/roles.sql
// applied and the schema migrated by the owner role, the runtime role
// cannot change the schema.
func TestScenario12DeployConfigRefuses(t *testing.T) {
	t.Parallel()
	t.Run("NATSPermissions", func(t *testing.T) {
		t.Parallel()
		deployNATS(t)
	})
	t.Run("PostgresRuntimeRoleDDL", func(t *testing.T) {
		t.Parallel()
		deployPostgres(t)
	})
}

func deployNATS(t *testing.T) {
	conf := deployFile(t, "nats/nats-server.conf")
	raw, err := os.ReadFile(conf)
	if err != nil {
		harness.Missing(t, conf, err, "the deploy NATS config is part of the repository")
	}
	r := &harness.Report{Scenario: "12 deploy NATS config refuses"}
	dir := t.TempDir()
	tlsFiles, err := harness.NewTLSFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	port, err := freeaddr.Port()
	if err != nil {
		t.Fatal(err)
	}
	// The shipped file with its paths and ports pointed at the test's.
	text := string(raw)
	for old, repl := range map[string]string{
		`"/etc/nats/tls/tls.crt"`: strconv.Quote(tlsFiles.Cert), `"/etc/nats/tls/tls.key"`: strconv.Quote(tlsFiles.Key),
		`"/etc/nats/tls/ca.crt"`: strconv.Quote(tlsFiles.CA), `store_dir: "/data"`: "store_dir: " + strconv.Quote(filepath.Join(dir, "js")),
		"\nport: 4222": "\nport: " + strconv.Itoa(port), "\nhttp_port: 8222": "\n",
	} {
		if !strings.Contains(text, old) {
			t.Fatalf("%s no longer contains %q: update this test", conf, old)
		}
		text = strings.Replace(text, old, repl, 1)
	}
	local := filepath.Join(dir, "nats-server.conf")
	if err := os.WriteFile(local, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	bins, err := harness.Build(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	p := &harness.Process{Name: "nats-server", Bin: bins.Path("nats-server"), Args: []string{"-c", local}, LogPath: filepath.Join(dir, "nats.log")}
	for _, u := range natsUsers {
		p.Env = append(p.Env, strings.ToUpper(u)+"_NATS_PASSWORD=pw-"+u)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Kill9() })
	url := "tls://127.0.0.1:" + strconv.Itoa(port)
	connect := func(user string, errs chan<- error) (*nats.Conn, error) {
		opts := []nats.Option{nats.RootCAs(tlsFiles.CA), nats.Timeout(2 * time.Second), nats.MaxReconnects(0)}
		if user != "" {
			opts = append(opts, nats.UserInfo(user, "pw-"+user))
		}
		if user != "" && user != "admin" {
			// Each user may read replies on its own inbox prefix only.
			opts = append(opts, nats.CustomInboxPrefix("_INBOX_"+user))
		}
		if errs != nil {
			opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				select {
				case errs <- err:
				default:
				}
			}))
		}
		return nats.Connect(url, opts...)
	}
	if _, ok := harness.Eventually(t.Context(), 20*time.Second, 50*time.Millisecond, func() bool {
		nc, err := connect("admin", nil)
		if err == nil {
			nc.Close()
		}
		return err == nil
	}); !ok {
		t.Fatalf("deploy nats config does not start or admin cannot connect:\n%s", harness.Tail(p.LogPath, 3000))
	}
	admin, err := connect("admin", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ajs, _ := jetstreamNew(admin)
	if err := streams.Ensure(t.Context(), ajs, streams.Options{}); err != nil {
		t.Fatalf("admin creates streams: %v", err)
	}

	// Anonymous: refused.
	if nc, err := connect("", nil); err == nil {
		nc.Close()
		t.Errorf("an anonymous client connected")
	} else if !errors.Is(err, nats.ErrAuthorization) {
		t.Errorf("anonymous connect refused for another reason: %v", err)
	}
	r.Fault("anonymous connect")
	// Without TLS: refused.
	if nc, err := nats.Connect("nats://127.0.0.1:"+strconv.Itoa(port), nats.UserInfo("ingress", "pw-ingress"), nats.Timeout(2*time.Second)); err == nil {
		nc.Close()
		t.Errorf("a client without TLS connected")
	}
	r.Fault("plain-text connect with valid credentials")

	// Each service user: its own subject is accepted by the stream, a
	// subject it must not publish is refused with a permissions violation.
	cases := []struct{ user, allowed, forbidden string }{
		{"ingress", "ingest.shop", "retry.job.failed.x"},
		{"ingress", "retry.event.failed.x", "retry.event.due.x"},
		{"triggers", "runs.fulfil.requested.r1", "events.shop.order.created"},
		{"triggers", "retry.event-trigger.failed.d1", "retry.event-trigger.due.d1"},
		{"scheduler", "retry.ft.due.x", "ingest.shop"},
		{"worker", "retry.job.succeeded.j1", "retry.job.due.j1"},
		{"producer", "ingest.shop", "events.shop.order.created"},
		{"runner", "runs.fulfil.completed.r1", "runs.fulfil.requested.r2"},
	}
	var mu sync.Mutex
	refused := 0
	for _, c := range cases {
		errs := make(chan error, 16)
		nc, err := connect(c.user, errs)
		if err != nil {
			t.Errorf("%s cannot connect: %v", c.user, err)
			continue
		}
		js, _ := jetstreamNew(nc)
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		if _, err := js.Publish(ctx, c.allowed, []byte(`{}`)); err != nil {
			t.Errorf("%s publishing %s (allowed): %v", c.user, c.allowed, err)
		}
		cancel()
		// A refused publish gets no PubAck: it times out.
		ctx, cancel = context.WithTimeout(t.Context(), time.Second)
		_, pubErr := js.Publish(ctx, c.forbidden, []byte(`{"forbidden":"`+c.user+`"}`))
		cancel()
		var violation error
		select {
		case violation = <-errs:
		case <-time.After(2 * time.Second):
		}
		nc.Close()
		if pubErr == nil || violation == nil || !strings.Contains(strings.ToLower(violation.Error()), "permissions violation") {
			t.Errorf("%s publishing %s (forbidden): publish error %v, async error %v", c.user, c.forbidden, pubErr, violation)
			continue
		}
		mu.Lock()
		refused++
		mu.Unlock()
		r.Fault("%s publishes %s: refused (%v)", c.user, c.forbidden, violation)
	}
	// Nothing forbidden reached a stream.
	for _, c := range cases {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		msgs, err := harness.Stored(ctx, ajs, streamOf(c.forbidden), c.forbidden)
		for _, m := range msgs {
			if strings.Contains(string(m.Data), `"forbidden":"`+c.user+`"`) {
				t.Errorf("%s reached the stream although %s may not publish it", c.forbidden, c.user)
			}
		}
		if err != nil {
			t.Errorf("read %s: %v", c.forbidden, err)
		}
		cancel()
	}
	r.Sent, r.Absorbed = len(cases)+2, refused+2
	r.Print(t)
}

func streamOf(subject string) string {
	switch strings.SplitN(subject, ".", 2)[0] {
	case "ingest":
		return "INGEST"
	case "events":
		return "EVENTS"
	case "runs":
		return "RUNS"
	case "jobs":
		return "JOBS"
	}
	return "RETRIES"
}

func deployPostgres(t *testing.T) {
	rolesSQL := deployFile(t, "postgres/roles.sql")
	if _, err := os.Stat(rolesSQL); err != nil {
		harness.Missing(t, rolesSQL, err, "the deploy Postgres roles are part of the repository")
	}
	pg := ownPostgres(t, "")
	out, err := exec.CommandContext(t.Context(), filepath.Join(pg.BinDir, "psql"), "-X", "-q", "-d", pg.URL("postgres"),
		"-v", "owner_password=pw-owner", "-v", "app_password=pw-app", "-f", rolesSQL).CombinedOutput()
	if err != nil {
		t.Fatalf("psql -f %s: %v\n%s", rolesSQL, err, out)
	}
	as := func(role string) string {
		return strings.Replace(pg.URL("retryd"), "postgres@", role+":pw-"+strings.TrimPrefix(role, "retryd_")+"@", 1)
	}
	if err := migrations.Up(t.Context(), as("retryd_owner"), zerolog.Nop()); err != nil {
		t.Fatalf("migrate as retryd_owner: %v", err)
	}
	app, err := pgx.Connect(t.Context(), as("retryd_app"))
	if err != nil {
		t.Fatalf("connect as retryd_app: %v", err)
	}
	defer app.Close(context.Background())
	// The runtime role does its job...
	if _, err := app.Exec(t.Context(), `INSERT INTO inbox (consumer, msg_id) VALUES ('faults', 'probe')`); err != nil {
		t.Fatalf("retryd_app cannot write rows: %v", err)
	}
	// ...and nothing more.
	ddl := []string{
		`CREATE TABLE faults_probe (x int)`,
		`ALTER TABLE retries ADD COLUMN faults_probe int`,
		`DROP TABLE inbox`,
		`CREATE INDEX faults_probe_idx ON retries (updated_at)`,
		`TRUNCATE retries`,
		`CREATE SCHEMA faults_probe`,
		`CREATE TEMP TABLE faults_probe (x int)`,
		`ALTER ROLE retryd_app SUPERUSER`,
	}
	for _, stmt := range ddl {
		_, err := app.Exec(t.Context(), stmt)
		if err == nil {
			t.Errorf("retryd_app ran %q", stmt)
			continue
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Errorf("retryd_app %q failed, but not for lack of privilege: %v", stmt, err)
		}
	}
	r := &harness.Report{Scenario: "12 runtime postgres role refuses DDL", Sent: len(ddl), Absorbed: len(ddl)}
	r.Fault("%d DDL statements as retryd_app after roles.sql and migrations as retryd_owner", len(ddl))
	r.Print(t)
}
