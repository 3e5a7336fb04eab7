package streams

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/retryd/retryd/internal/envvar"
)

// EnvMaxBytes and EnvMaxAge name the variables that set one stream's
// max_bytes and max_age: RETRYD_STREAM_RETRIES_MAX_BYTES=8GiB. Every binary
// that creates streams reads them (the services, which create a missing
// stream, and `retryd streams ensure|export`), so give them to all alike.
func EnvMaxBytes(stream string) string { return "RETRYD_STREAM_" + stream + "_MAX_BYTES" }

// EnvMaxAge: see EnvMaxBytes.
func EnvMaxAge(stream string) string { return "RETRYD_STREAM_" + stream + "_MAX_AGE" }

// EnvShards names the variable that splits RETRIES into scheduler shards
// (Options.Shards). Every service and `retryd streams ensure` read it, so
// a stream a service recreates is split as the deployment is.
const EnvShards = "RETRYD_SHARDS"

// OptionsFromEnv reads the per-stream limits (EnvMaxBytes, EnvMaxAge) into
// Options, adding to e what is wrong with them; unset variables leave the
// defaults. Replicas and Storage are left to the caller.
func OptionsFromEnv(e *envvar.Reader) Options {
	var o Options
	for _, name := range Names {
		if v := os.Getenv(EnvMaxBytes(name)); v != "" {
			n, err := ParseBytes(v)
			if err != nil {
				e.Add(fmt.Errorf("%s: %w", EnvMaxBytes(name), err))
				continue
			}
			if o.MaxBytes == nil {
				o.MaxBytes = map[string]int64{}
			}
			o.MaxBytes[name] = n
		}
		if os.Getenv(EnvMaxAge(name)) != "" {
			if o.MaxAge == nil {
				o.MaxAge = map[string]time.Duration{}
			}
			o.MaxAge[name] = e.Duration(EnvMaxAge(name), 0)
		}
	}
	o.Shards = e.Int(EnvShards)
	if err := o.Validate(); err != nil {
		e.Add(fmt.Errorf("RETRYD_STREAM_*: %w", err))
	}
	return o
}

// ParseBytes reads a size: a number of bytes, or a whole number with a
// KiB, MiB, GiB or TiB suffix ("8GiB"); -1 is no limit.
func ParseBytes(v string) (int64, error) {
	s := strings.TrimSpace(v)
	unit := int64(1)
	for _, u := range []struct {
		suffix string
		n      int64
	}{{"KiB", KiB}, {"MiB", MiB}, {"GiB", GiB}, {"TiB", 1 << 40}} {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			s, unit = strings.TrimSpace(rest), u.n
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	switch {
	case err == nil && n == -1 && unit == 1:
		return -1, nil
	case err != nil || n <= 0 || n > (1<<62)/unit:
		return 0, fmt.Errorf("must be a size such as 1073741824 or 8GiB (KiB, MiB, GiB, TiB), or -1 for no limit, got %q", v)
	}
	return n * unit, nil
}
