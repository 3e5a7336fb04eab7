package streams_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/internal/streams"
)

// deployDir is deploy/streams at the repository root.
const deployDir = "../../deploy/streams"

// TestDeployFilesAreCurrent fails when deploy/streams differs from what
// Export writes, e.g. after a change to Configs.
func TestDeployFilesAreCurrent(t *testing.T) {
	t.Parallel()
	const regen = "deploy/streams is stale: regenerate it with `go generate ./internal/streams` from the repository root"
	for _, d := range streams.DeployDirs {
		want := t.TempDir()
		require.NoError(t, streams.Export(want, d.Options))
		gotDir := filepath.Join(deployDir, d.Dir)

		wantFiles := jsonFiles(t, want)
		require.Equal(t, wantFiles, jsonFiles(t, gotDir), "%s: %s", gotDir, regen)
		for _, name := range wantFiles {
			w, err := os.ReadFile(filepath.Join(want, name))
			require.NoError(t, err)
			g, err := os.ReadFile(filepath.Join(gotDir, name))
			require.NoError(t, err, regen)
			require.Equal(t, string(w), string(g), "%s/%s: %s", gotDir, name, regen)
		}
	}
}

func jsonFiles(t *testing.T, dir string) []string {
	t.Helper()
	matches, err := filepath.Glob(filepath.Join(dir, "*.json"))
	require.NoError(t, err)
	names := make([]string, 0, len(matches))
	for _, m := range matches {
		names = append(names, filepath.Base(m))
	}
	slices.Sort(names)
	return names
}

// The exported JSON is the server's own StreamConfig: it decodes strictly
// into server.StreamConfig and jetstream.StreamConfig, and the server
// creates the stream from the file's bytes, as `nats stream add --config`
// sends them.
func TestExportedJSONIsAServerStreamConfig(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, streams.Export(dir, streams.Options{}))
	srv := natstest.RunServer(t)
	nc, js := natstest.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	for _, want := range streams.Configs(streams.Options{}) {
		raw, err := os.ReadFile(filepath.Join(dir, want.Name+".json"))
		require.NoError(t, err)

		var sc server.StreamConfig
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		require.NoError(t, dec.Decode(&sc), want.Name)
		require.Equal(t, want.Name, sc.Name)
		require.Equal(t, want.Subjects, sc.Subjects)
		require.Equal(t, server.LimitsPolicy, sc.Retention)
		require.Equal(t, server.FileStorage, sc.Storage)
		require.Equal(t, server.DiscardPolicy(want.Discard), sc.Discard)
		require.Equal(t, want.MaxBytes, sc.MaxBytes)
		require.Equal(t, want.MaxAge, sc.MaxAge)
		require.Equal(t, 2*time.Minute, sc.Duplicates)
		require.Equal(t, want.MaxMsgSize, sc.MaxMsgSize)
		require.Equal(t, 1, sc.Replicas)

		var jc jetstream.StreamConfig
		require.NoError(t, json.Unmarshal(raw, &jc))
		require.Equal(t, want, jc)

		// What the nats CLI does with --config: the file is the request.
		resp, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.CREATE."+want.Name, raw)
		require.NoError(t, err)
		var created struct {
			Config jetstream.StreamConfig `json:"config"`
			Error  *jetstream.APIError    `json:"error"`
		}
		require.NoError(t, json.Unmarshal(resp.Data, &created))
		require.Nil(t, created.Error, "%s: %v", want.Name, created.Error)
		require.Equal(t, want.MaxAge, created.Config.MaxAge)
		require.Equal(t, want.MaxBytes, created.Config.MaxBytes)
		require.Equal(t, want.Discard, created.Config.Discard)
		require.Equal(t, want.Subjects, created.Config.Subjects)
	}
	// Streams created from files are what Ensure wants: Ensure is a no-op.
	require.NoError(t, streams.Ensure(ctx, js, streams.Options{}))
}

func TestExportR3(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, streams.Export(dir, streams.Options{Replicas: 3}))
	require.Equal(t, []string{"EVENTS.json", "INGEST.json", "JOBS.json", "RETRIES.json", "RUNS.json", "SCHEDULES.json"}, jsonFiles(t, dir))
	for _, name := range streams.Names {
		raw, err := os.ReadFile(filepath.Join(dir, name+".json"))
		require.NoError(t, err)
		var sc server.StreamConfig
		require.NoError(t, json.Unmarshal(raw, &sc))
		require.Equal(t, 3, sc.Replicas, name)
	}
}

// TestShippedStreamsAreBounded fails on any stream retryd ships without
// a max_bytes: one unbounded stream can fill the server's store, and a
// full store refuses every stream's publishes. It reads every JSON file
// under deploy/streams, whatever directory a later layout adds, and the
// configurations Ensure creates.
func TestShippedStreamsAreBounded(t *testing.T) {
	t.Parallel()
	files := 0
	require.NoError(t, filepath.WalkDir(deployDir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Ext(path) != ".json" {
			return err
		}
		raw, err := os.ReadFile(path)
		require.NoError(t, err)
		var sc server.StreamConfig
		require.NoError(t, json.Unmarshal(raw, &sc), path)
		require.Positive(t, sc.MaxBytes, "%s: max_bytes", path)
		files++
		return nil
	}))
	require.GreaterOrEqual(t, files, 2*len(streams.Names), "deploy/streams and deploy/streams/r3")
	for _, d := range append(streams.DeployDirs, streams.DeployDir{Options: streams.Options{}}) {
		for _, c := range streams.Configs(d.Options) {
			require.Positive(t, c.MaxBytes, "%s (%s): max_bytes", c.Name, d.Dir)
		}
	}
}
