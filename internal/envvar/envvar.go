// Package envvar reads the environment variables the retryd binaries are
// configured with. A Reader collects every error, each naming its
// variable, so a misconfigured service reports all its mistakes at once.
package envvar

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"time"
)

// String returns the variable, or def when it is unset or empty.
func String(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// Reader parses optional variables; the zero value is ready to use.
type Reader struct {
	errs []error
	// renamed maps a variable's name to the name it had before, which
	// still works (see Renamed).
	renamed     map[string]string
	deprecation []string
}

// Renamed makes old, the name a variable had before, an alias of name:
// read as name, its value comes from old when only old is set, and
// Deprecations says so. Setting both to different values is an error.
// Call it before reading name.
func (r *Reader) Renamed(name, old string) {
	if r.renamed == nil {
		r.renamed = map[string]string{}
	}
	r.renamed[name] = old
}

// Deprecations lists the old names that were used, each with its new
// name, for the service to log once at start.
func (r *Reader) Deprecations() []string { return r.deprecation }

// get returns name's value, or its old name's (see Renamed).
func (r *Reader) get(name string) string {
	v := os.Getenv(name)
	old, ok := r.renamed[name]
	if !ok {
		return v
	}
	switch ov := os.Getenv(old); {
	case ov == "":
	case v == "":
		r.deprecation = append(r.deprecation, fmt.Sprintf("%s is deprecated: it was renamed %s", old, name))
		return ov
	case ov != v:
		r.Add(fmt.Errorf("%s and %s (its old name) are both set, to %q and %q: set only %s", name, old, v, ov, name))
	}
	return v
}

// Int returns a non-negative integer, 0 when unset.
func (r *Reader) Int(name string) int {
	return int(r.Int64(name))
}

// Int64 returns a non-negative integer, 0 when unset.
func (r *Reader) Int64(name string) int64 {
	v := r.get(name)
	if v == "" {
		return 0
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		r.Add(fmt.Errorf("%s must be a non-negative integer, got %q", name, v))
		return 0
	}
	return n
}

// Float returns a non-negative finite number such as 2.5, 0 when unset.
func (r *Reader) Float(name string) float64 {
	v := r.get(name)
	if v == "" {
		return 0
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) {
		r.Add(fmt.Errorf("%s must be a non-negative number, got %q", name, v))
		return 0
	}
	return f
}

// Duration returns a Go duration such as 30s, def when unset.
func (r *Reader) Duration(name string, def time.Duration) time.Duration {
	v := r.get(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		r.Add(fmt.Errorf("%s must be a duration such as 30s, got %q", name, v))
		return def
	}
	return d
}

// Bool returns true or false (strconv.ParseBool), def when unset.
func (r *Reader) Bool(name string, def bool) bool {
	v := r.get(name)
	if v == "" {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		r.Add(fmt.Errorf("%s must be true or false, got %q", name, v))
		return def
	}
	return b
}

// Add records an error found while reading the configuration.
func (r *Reader) Add(err error) { r.errs = append(r.errs, err) }

// Err joins every error recorded; nil when there was none.
func (r *Reader) Err() error { return errors.Join(r.errs...) }
