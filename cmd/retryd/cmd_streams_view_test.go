package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/pkg/contract"
)

// retryd streams view prints what is stored: lifecycle facts with their
// headers and JSON indented, a payload that is not JSON escaped, a large
// one shortened unless --raw, one JSON object per message with --json;
// it refuses what it cannot read, and creates no consumer.
func TestStreamsViewCommand(t *testing.T) {
	t.Parallel()
	srv := natstest.RunServer(t)
	_, js := natstest.Connect(t, srv)
	natstest.EnsureStreams(t, js)
	url := fmt.Sprintf("nats://127.0.0.1:%d", natstest.Port(srv))
	ctx := t.Context()

	failed, err := contract.NewLifecycleMsg("retryd/test", contract.Failed, contract.FailedData{
		Kind: contract.KindJob, ID: "01JVIEW0000000000000000001", Attempt: 1, JobType: "send_email",
		Error: contract.ErrorInfo{Class: "timeout", Message: "smtp timed out"},
	}, time.Now())
	require.NoError(t, err)
	_, err = js.PublishMsg(ctx, failed)
	require.NoError(t, err)
	odd := nats.NewMsg("retry.job.failed.01JVIEW0000000000000000002")
	odd.Data = []byte("not json \x1b[31m red")
	_, err = js.PublishMsg(ctx, odd)
	require.NoError(t, err)
	big := nats.NewMsg("retry.event.failed.01JVIEW0000000000000000003")
	big.Data = fmt.Appendf(nil, `{"blob":%q,"end":"the-end"}`, strings.Repeat("x", 10_000))
	_, err = js.PublishMsg(ctx, big)
	require.NoError(t, err)

	view := func(args ...string) result {
		return cli(t, append([]string{"streams", "view", "--nats-url", url}, args...)...)
	}
	r := view("RETRIES")
	require.Equal(t, exitOK, r.code, r.stderr)
	out := r.stdout
	require.Contains(t, out, "[1] Subject: retry.job.failed.01JVIEW0000000000000000001 Received: ")
	require.Contains(t, out, "  Nats-Msg-Id: "+failed.Header.Get(nats.MsgIdHdr)+"\n")
	require.Contains(t, out, "  Retryd-Kind: job\n")
	require.Contains(t, out, "  Retryd-Item-Id: 01JVIEW0000000000000000001\n")
	require.Contains(t, out, "  Retryd-Attempt: 1\n")
	require.NotContains(t, out, "Nats-Stream:", "where a direct get found it is no header of the message")
	require.Contains(t, out, "\n{\n  \"specversion\": \"1.0\",\n", "the payload indented")
	require.Contains(t, out, `"message": "smtp timed out"`)
	require.Contains(t, out, "(not JSON: 18 bytes, escaped)\n\"not json \\x1b[31m red\"\n")
	require.NotContains(t, out, "\x1b", "no control character reaches the terminal")
	require.Contains(t, out, fmt.Sprintf("\n… (shortened to 4096 bytes; the payload has %d: --raw prints it whole)\n", len(big.Data)))
	require.NotContains(t, out, "the-end")
	require.Contains(t, out, "3 message(s).")

	r = view("RETRIES", "--raw", "--subject", "retry.event.>")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, string(big.Data)+"\n", "--raw prints the payload whole, as stored")

	r = view("RETRIES", "--last", "2", "--subject", "retry.job.>")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "[1] Subject: retry.job.failed.01JVIEW0000000000000000001")
	require.Contains(t, r.stdout, "[2] Subject: retry.job.failed.01JVIEW0000000000000000002")
	require.Contains(t, r.stdout, "2 message(s).")

	r = view("RETRIES", "--count", "1", "--since-seq", "2")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "[2] Subject: ")
	require.NotContains(t, r.stdout, "[3]")
	require.Contains(t, r.stdout, "Next page: --since-seq 3")

	r = view("RETRIES", "--subject", "retry.run.>")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "No message on retry.run.> (the stream holds sequences 1 to 3).")

	r = view("RETRIES", "--json")
	require.Equal(t, exitOK, r.code, r.stderr)
	var lines []viewedMsg
	sc := bufio.NewScanner(strings.NewReader(r.stdout))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var v viewedMsg
		require.NoError(t, json.Unmarshal(sc.Bytes(), &v), "one JSON object per line: %s", sc.Text())
		lines = append(lines, v)
	}
	require.Len(t, lines, 3)
	require.Equal(t, uint64(1), lines[0].Seq)
	require.Equal(t, "job", lines[0].Headers[contract.HeaderKind][0])
	require.JSONEq(t, string(failed.Data), string(lines[0].Data), "data is the payload, as JSON")
	require.Nil(t, lines[1].Data)
	require.Equal(t, string(odd.Data), *lines[1].DataText)
	require.JSONEq(t, string(big.Data), string(lines[2].Data), "--json shortens nothing")

	r = view("NOPE")
	require.Equal(t, exitFailed, r.code)
	require.Contains(t, r.stderr, "stream NOPE not found (retryd's are INGEST, EVENTS, RETRIES")
	requireUsage(t, []usageCase{
		{[]string{"streams", "view", "--nats-url", url, "RETRIES", "--count", "5000"}, "--count 5000: give 1 to 1000"},
		{[]string{"streams", "view", "--nats-url", url, "RETRIES", "--count", "0"}, "--count 0"},
		{[]string{"streams", "view", "--nats-url", url, "RETRIES", "--last", "1001"}, "--last 1001: give 1 to 1000"},
		{[]string{"streams", "view", "--nats-url", url, "RETRIES", "--last", "2", "--count", "3"}, "without --since-seq and --count"},
		{[]string{"streams", "view", "--nats-url", url, "RETRIES", "--subject", "retry..x"}, `--subject "retry..x"`},
		{[]string{"streams", "view", "--nats-url", url, "RETRIES.>"}, `stream name "RETRIES.>"`},
		{[]string{"streams", "view", "--nats-url", url}, "STREAM"},
	})

	for _, name := range []string{contract.StreamRetries, contract.StreamEvents} {
		s, err := js.Stream(ctx, name)
		require.NoError(t, err)
		require.Zero(t, s.CachedInfo().State.Consumers, "%s: viewing created no consumer", name)
	}
}
