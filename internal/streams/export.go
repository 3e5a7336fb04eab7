package streams

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

//go:generate go run ./internal/exportgen -dir ../../deploy/streams

// Export writes one file per stream, <dir>/<NAME>.json, holding the stream
// configuration in the JSON form of the server's StreamConfig, which is what
// `nats stream add --config <dir>/<NAME>.json` takes. Durations are in
// nanoseconds, as the server writes them. dir is created if missing.
func Export(dir string, opts Options) error {
	if err := opts.Validate(); err != nil {
		return fmt.Errorf("export streams: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("export streams: %w", err)
	}
	for _, cfg := range Configs(opts) {
		b, err := MarshalConfig(cfg)
		if err != nil {
			return fmt.Errorf("export stream %s: %w", cfg.Name, err)
		}
		if err := os.WriteFile(filepath.Join(dir, cfg.Name+".json"), b, 0o644); err != nil {
			return fmt.Errorf("export stream %s: %w", cfg.Name, err)
		}
	}
	return nil
}

// MarshalConfig encodes a stream configuration the way Export writes it:
// indented JSON with a trailing newline.
func MarshalConfig(cfg any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // keep retry.<kind>... readable
	enc.SetIndent("", "  ")
	if err := enc.Encode(cfg); err != nil {
		return nil, fmt.Errorf("marshal stream config: %w", err)
	}
	return buf.Bytes(), nil
}

// DeployDir is one directory of deploy/streams and the options it is
// generated with.
type DeployDir struct {
	// Dir is relative to deploy/streams; "" is the directory itself.
	Dir     string
	Options Options
}

// DeployDirs are the generated directories of deploy/streams: single
// server (R1) files at the top and three-replica files in r3/.
var DeployDirs = []DeployDir{
	{Dir: "", Options: Options{Replicas: 1}},
	{Dir: "r3", Options: Options{Replicas: 3}},
}
