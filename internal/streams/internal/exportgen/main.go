// Command exportgen writes deploy/streams: the stream configurations for a
// single server (<dir>/*.json) and for a three-node cluster
// (<dir>/r3/*.json). Run it with `go generate ./internal/streams`.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/retryd/retryd/internal/streams"
)

func main() {
	dir := flag.String("dir", "deploy/streams", "output directory")
	flag.Parse()
	if err := run(*dir); err != nil {
		fmt.Fprintln(os.Stderr, "exportgen:", err)
		os.Exit(1)
	}
}

func run(dir string) error {
	for _, d := range streams.DeployDirs {
		if err := streams.Export(filepath.Join(dir, d.Dir), d.Options); err != nil {
			return err
		}
	}
	return nil
}
