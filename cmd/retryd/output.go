package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"
)

// printJSON writes an API answer indented, as --json prints it.
func printJSON(w io.Writer, raw json.RawMessage) error {
	var buf bytes.Buffer
	if err := json.Indent(&buf, bytes.TrimSpace(raw), "", "  "); err != nil {
		return fmt.Errorf("format JSON: %w", err)
	}
	buf.WriteByte('\n')
	_, err := w.Write(buf.Bytes())
	return err
}

// writeJSON encodes v indented, for output the CLI computes itself.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// table writes aligned columns; cells never hold tabs or newlines.
type table struct {
	tw *tabwriter.Writer
}

func newTable(w io.Writer, header ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)}
	t.row(header...)
	return t
}

func (t *table) row(cells ...string) {
	for i, c := range cells {
		cells[i] = clean(c)
	}
	fmt.Fprintln(t.tw, strings.Join(cells, "\t"))
}

func (t *table) flush() error { return t.tw.Flush() }

// keyValues writes "key:  value" lines aligned.
func keyValues(w io.Writer, pairs ...string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for i := 0; i+1 < len(pairs); i += 2 {
		fmt.Fprintf(tw, "%s:\t%s\n", pairs[i], clean(pairs[i+1]))
	}
	return tw.Flush()
}

// clean keeps a cell on one line.
func clean(s string) string {
	if s == "" {
		return "-"
	}
	return strings.Map(func(r rune) rune {
		if r == '\t' || r == '\n' || r == '\r' {
			return ' '
		}
		return r
	}, s)
}

// trunc shortens s to n runes with an ellipsis.
func trunc(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// relTime says when t is relative to now: "in 4s", "2m ago".
func relTime(t *time.Time, now time.Time) string {
	if t == nil || t.IsZero() {
		return ""
	}
	d := t.Sub(now)
	if d >= 0 {
		if d < time.Second {
			return "now"
		}
		return "in " + shortDuration(d)
	}
	return shortDuration(-d) + " ago"
}

// stamp is a time in RFC 3339 (local zone) with its relative form.
func stamp(t *time.Time, now time.Time) string {
	if t == nil || t.IsZero() {
		return ""
	}
	return t.Local().Format(time.RFC3339) + " (" + relTime(t, now) + ")"
}

// shortDuration rounds d to what a human reads: 850ms, 4.2s, 3m10s, 2h5m,
// 3d4h20m.
func shortDuration(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < 10*time.Second:
		return d.Round(100 * time.Millisecond).String()
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Round(time.Second)/time.Second))
	}
	d = d.Round(time.Second)
	days, hours := int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour)
	if days < 2 { // "30h" reads better than "1d6h"
		days, hours = 0, int(d/time.Hour)
	}
	mins, secs := int(d%time.Hour/time.Minute), int(d%time.Minute/time.Second)
	var b strings.Builder
	if days > 0 {
		fmt.Fprintf(&b, "%dd", days)
	}
	if hours > 0 {
		fmt.Fprintf(&b, "%dh", hours)
	}
	if mins > 0 {
		fmt.Fprintf(&b, "%dm", mins)
	}
	if secs > 0 && days == 0 && hours == 0 {
		fmt.Fprintf(&b, "%ds", secs)
	}
	return b.String()
}

// msDuration formats milliseconds as a duration.
func msDuration(ms int64) string {
	if ms >= math.MaxInt64/int64(time.Millisecond) {
		return "∞"
	}
	return shortDuration(time.Duration(ms) * time.Millisecond)
}

// percent formats a ratio in [0, 1].
func percent(r *float64) string {
	if r == nil {
		return ""
	}
	return fmt.Sprintf("%.1f%%", *r*100)
}

func joinOr(list []string, empty string) string {
	if len(list) == 0 {
		return empty
	}
	return strings.Join(list, ",")
}
