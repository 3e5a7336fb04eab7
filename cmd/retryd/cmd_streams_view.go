package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/retryd/retryd/internal/streams"
)

const (
	// viewMaxCount caps a page: each message is one request.
	viewMaxCount = 1000
	// viewPayloadLimit is how much of a payload a page shows without
	// --raw, so that one large payload does not bury the others.
	viewPayloadLimit = 4096
)

func newStreamsViewCmd(g *globals) *cobra.Command {
	var nf natsFlags
	var o streams.ViewOptions
	var raw bool
	cmd := &cobra.Command{
		Use:   "view STREAM",
		Short: "Page a stream's messages with message gets, creating no consumer",
		Long: `Print a stream's messages, oldest first: sequence, subject, time, headers and
the payload (JSON indented). It reads with JetStream message gets (direct gets
where the stream allows them) and creates no consumer, so the read-only NATS
operator user may run it, unlike nats stream view. Each message is one request:
--count is at most ` + strconv.Itoa(viewMaxCount) + `. --json prints one JSON object per line.`,
		Example: `  retryd streams view RETRIES --subject 'retry.job.*.01J9ZX3K5Q8V2N4M6P7R9S0T1W'
  retryd streams view RETRIES --last 5 --subject 'retry.*.exhausted.*'
  retryd streams view EVENTS --since-seq 1200 --count 50 --json`,
		Args: args(1, "STREAM"),
		RunE: func(cmd *cobra.Command, a []string) error {
			name := a[0]
			if err := checkViewFlags(cmd, name, &o); err != nil {
				return err
			}
			return nf.run(cmd, g, func(ctx context.Context, js jetstream.JetStream) error {
				s, err := js.Stream(ctx, name)
				if errors.Is(err, jetstream.ErrStreamNotFound) {
					return fmt.Errorf("stream %s not found (retryd's are %s; retryd streams list shows them)", name, strings.Join(streams.Names, ", "))
				}
				if err != nil {
					return fmt.Errorf("read stream %s: %w", name, err)
				}
				msgs, err := streams.View(ctx, s, o)
				if err != nil {
					return err
				}
				return printView(g, s.CachedInfo().State, o, msgs, raw)
			})
		},
	}
	nf.register(cmd)
	f := cmd.Flags()
	f.StringVar(&o.Subject, "subject", ">", "only messages on this subject (wildcards * and > allowed)")
	f.Uint64Var(&o.FromSeq, "since-seq", 0, "the first sequence to read (default the stream's first)")
	f.IntVar(&o.Last, "last", 0, "the last N messages instead (at most "+strconv.Itoa(viewMaxCount)+")")
	f.IntVar(&o.Count, "count", 20, "how many messages at most (at most "+strconv.Itoa(viewMaxCount)+")")
	f.BoolVar(&raw, "raw", false, "print each payload whole and as stored (not indented, escaped or shortened)")
	return cmd
}

// checkViewFlags refuses what view cannot read, before it connects.
func checkViewFlags(cmd *cobra.Command, name string, o *streams.ViewOptions) error {
	if name == "" || strings.ContainsAny(name, ".*> \t\r\n") {
		return usageErrorf(cmd, "stream name %q: a stream's name has no '.', '*', '>' or spaces", name)
	}
	if !server.IsValidSubject(o.Subject) {
		return usageErrorf(cmd, "--subject %q is not a subject filter (tokens separated by '.', '*' for one token, '>' last for the rest)", o.Subject)
	}
	changed := cmd.Flags().Changed
	if changed("last") {
		if changed("since-seq") || changed("count") {
			return usageErrorf(cmd, "--last reads the last N messages: give it without --since-seq and --count")
		}
		if o.Last < 1 || o.Last > viewMaxCount {
			return usageErrorf(cmd, "--last %d: give 1 to %d", o.Last, viewMaxCount)
		}
	}
	if o.Count < 1 || o.Count > viewMaxCount {
		return usageErrorf(cmd, "--count %d: give 1 to %d (page on with --since-seq)", o.Count, viewMaxCount)
	}
	return nil
}

// viewedMsg is a message as --json prints it: data when the payload is
// JSON, else data_text when it is UTF-8, else data_base64.
type viewedMsg struct {
	Seq        uint64              `json:"seq"`
	Subject    string              `json:"subject"`
	Time       time.Time           `json:"time"`
	Headers    map[string][]string `json:"headers,omitempty"`
	Data       json.RawMessage     `json:"data,omitempty"`
	DataText   *string             `json:"data_text,omitempty"`
	DataBase64 []byte              `json:"data_base64,omitempty"`
}

func printView(g *globals, state jetstream.StreamState, o streams.ViewOptions, msgs []*jetstream.RawStreamMsg, raw bool) error {
	if g.json {
		enc := json.NewEncoder(g.stdout)
		enc.SetEscapeHTML(false)
		for _, m := range msgs {
			v := viewedMsg{Seq: m.Sequence, Subject: m.Subject, Time: m.Time.UTC(), Headers: m.Header}
			switch {
			case json.Valid(m.Data):
				v.Data = m.Data
			case utf8.Valid(m.Data):
				text := string(m.Data)
				v.DataText = &text
			default:
				v.DataBase64 = m.Data
			}
			if err := enc.Encode(v); err != nil {
				return err
			}
		}
		return nil
	}
	w := g.stdout
	for _, m := range msgs {
		fmt.Fprintf(w, "[%d] Subject: %s Received: %s\n", m.Sequence, escapeText(m.Subject), m.Time.UTC().Format(time.RFC3339Nano))
		keys := make([]string, 0, len(m.Header))
		for k := range m.Header {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			for _, v := range m.Header[k] {
				fmt.Fprintf(w, "  %s: %s\n", escapeText(k), escapeText(v))
			}
		}
		fmt.Fprintln(w)
		writePayload(w, m.Data, raw)
		fmt.Fprintln(w)
	}
	switch {
	case len(msgs) == 0:
		fmt.Fprintf(w, "No message on %s (the stream holds sequences %d to %d).\n", escapeText(subjectOr(o.Subject)), state.FirstSeq, state.LastSeq)
	case o.Last == 0 && len(msgs) == o.Count:
		fmt.Fprintf(w, "%d message(s). Next page: --since-seq %d\n", len(msgs), msgs[len(msgs)-1].Sequence+1)
	default:
		fmt.Fprintf(w, "%d message(s).\n", len(msgs))
	}
	return nil
}

func subjectOr(s string) string {
	if s == "" {
		return ">"
	}
	return s
}

// writePayload writes a payload for a terminal: JSON indented, anything
// else escaped, each shortened to viewPayloadLimit bytes with a note; raw
// writes it as stored.
func writePayload(w io.Writer, data []byte, raw bool) {
	if raw {
		w.Write(data)
		fmt.Fprintln(w)
		return
	}
	if len(data) == 0 {
		fmt.Fprintln(w, "(no payload)")
		return
	}
	var text []byte
	var buf bytes.Buffer
	if json.Indent(&buf, data, "", "  ") == nil {
		text = graphicJSON(buf.Bytes())
	} else {
		fmt.Fprintf(w, "(not JSON: %d bytes, escaped)\n", len(data))
		text = []byte(strconv.Quote(string(data)))
	}
	if len(text) <= viewPayloadLimit {
		fmt.Fprintf(w, "%s\n", text)
		return
	}
	cut := viewPayloadLimit
	for cut > 0 && !utf8.RuneStart(text[cut]) {
		cut--
	}
	fmt.Fprintf(w, "%s\n… (shortened to %d bytes; the payload has %d: --raw prints it whole)\n", text[:cut], cut, len(data))
}

// graphicJSON escapes, as \uXXXX, what JSON strings may hold raw and a
// terminal could act on (DEL, C1 controls, bidi overrides), and replaces
// invalid UTF-8; the result is the same JSON value.
func graphicJSON(text []byte) []byte {
	if utf8.Valid(text) && bytes.IndexFunc(text, func(r rune) bool { return r != '\n' && !unicode.IsGraphic(r) }) < 0 {
		return text
	}
	out := make([]byte, 0, len(text)+16)
	for len(text) > 0 {
		r, n := utf8.DecodeRune(text)
		text = text[n:]
		switch {
		case r == '\n' || (r != utf8.RuneError && unicode.IsGraphic(r)):
			out = utf8.AppendRune(out, r)
		case r > 0xFFFF:
			r1, r2 := utf16.EncodeRune(r)
			out = fmt.Appendf(out, `\u%04x\u%04x`, r1, r2)
		default:
			out = fmt.Appendf(out, `\u%04x`, r)
		}
	}
	return out
}

// escapeText quotes a string a terminal could misread (control
// characters, invalid UTF-8); plain text stays as it is.
func escapeText(s string) string {
	if !utf8.ValidString(s) || strings.IndexFunc(s, func(r rune) bool { return !unicode.IsGraphic(r) }) >= 0 {
		return strconv.Quote(s)
	}
	return s
}
