package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/ingress"
)

func init() {
	register("ingress-http", "events/s accepted by ingress over HTTP (202 after the JetStream PubAck, file storage), single and batch", benchIngressHTTP)
}

// ingressHTTPRun is one measured phase: clients keep-alive connections
// sending for dur after warmup, batch events per request (1: POST
// /v1/events, more: POST /v1/events:batch).
type ingressHTTPRun struct {
	name           string
	clients, batch int
	warmup, dur    time.Duration
}

type ingressHTTPResult struct {
	run      ingressHTTPRun
	events   int64 // accepted in the measured window
	requests int64
	total    int64 // accepted, warm-up and tail included
	elapsed  time.Duration
	lat      summary
}

func benchIngressHTTP(ctx context.Context, env Env) error {
	runs := []ingressHTTPRun{
		{name: "POST /v1/events", clients: 64, batch: 1, warmup: 3 * time.Second, dur: 20 * time.Second},
		{name: "POST /v1/events:batch (100)", clients: 16, batch: 100, warmup: 2 * time.Second, dur: 10 * time.Second},
	}
	if env.Quick {
		runs = []ingressHTTPRun{
			{name: "POST /v1/events", clients: 32, batch: 1, warmup: 500 * time.Millisecond, dur: 3 * time.Second},
			{name: "POST /v1/events:batch (100)", clients: 8, batch: 100, warmup: 500 * time.Millisecond, dur: 2 * time.Second},
		}
	}

	ns, err := startNATS(env.NATSSync)
	if err != nil {
		return err
	}
	defer ns.close()
	if err := streams.Ensure(ctx, ns.js, streams.Options{}); err != nil {
		return fmt.Errorf("ensure streams: %w", err)
	}
	db, err := newRetrydDB(ctx, env.pg)
	if err != nil {
		return err
	}
	defer db.close(ctx)
	nc, js, err := ns.connect("retryd-ingress")
	if err != nil {
		return err
	}
	defer nc.Close()
	// Intake only: the gate is a separate consumer that would compete for
	// the same two cores; it is not started.
	svc, err := ingress.New(ingress.Config{Pool: db.pool, JS: js, Logger: zerolog.Nop(), Registerer: prometheus.NewRegistry(),
		MaxBatchBodyBytes: 8 << 20})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	// Auth off (loopback, as `retryd dev`): the bench measures intake, not
	// token checks (cached 5 s per token when on).
	srv := &http.Server{Handler: serve.Guard{}.Handler(svc.Handler()), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer func() { _ = srv.Shutdown(context.WithoutCancel(ctx)) }()
	url := "http://" + ln.Addr().String()

	var results []ingressHTTPResult
	var accepted int64
	for i, r := range runs {
		res, err := runIngressHTTP(ctx, url, r, "r"+strconv.Itoa(i))
		if err != nil {
			return err
		}
		accepted += res.total
		results = append(results, res)
	}

	// Every accepted event is in INGEST: the 202s were durable.
	stream, err := ns.js.Stream(ctx, contract.StreamIngest)
	if err != nil {
		return fmt.Errorf("read INGEST: %w", err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("read INGEST: %w", err)
	}

	w := tabwriter.NewWriter(env.Out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "endpoint\tclients\tevents/s\trequests/s\tp50\tp99\tmax\tevents")
	for _, res := range results {
		secs := res.elapsed.Seconds()
		fmt.Fprintf(w, "%s\t%d\t%.0f\t%.0f\t%s\t%s\t%s\t%d\n", res.run.name, res.run.clients,
			float64(res.events)/secs, float64(res.requests)/secs, ms(res.lat.P50), ms(res.lat.P99), ms(res.lat.Max), res.events)
	}
	_ = w.Flush()
	fmt.Fprintf(env.Out, "latency is per request, 202 answered after the PubAck; INGEST holds %d messages for %d events answered 202 (warm-up included)\n",
		info.State.Msgs, accepted)
	fmt.Fprintf(env.Out, "durability: JetStream file storage, NATS %s; target >= 10,000 events/s on POST /v1/events\n", env.NATSSync.String())
	if info.State.Msgs != uint64(accepted) {
		return fmt.Errorf("INGEST holds %d messages, %d events were accepted", info.State.Msgs, accepted)
	}
	return nil
}

// runIngressHTTP drives one phase. Event ids are unique (prefix, client,
// counter) so every request stores new events.
func runIngressHTTP(ctx context.Context, url string, r ingressHTTPRun, prefix string) (ingressHTTPResult, error) {
	transport := &http.Transport{
		MaxIdleConns:        r.clients,
		MaxIdleConnsPerHost: r.clients,
		MaxConnsPerHost:     r.clients,
		DisableCompression:  true,
	}
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport, Timeout: 30 * time.Second}
	path := url + "/v1/events"
	if r.batch > 1 {
		path = url + "/v1/events:batch"
	}

	start := time.Now()
	measureFrom := start.Add(r.warmup)
	end := measureFrom.Add(r.dur)
	var lat latencies
	var events, requests, total atomic.Int64
	var firstErr error
	var errOnce sync.Once
	var wg sync.WaitGroup
	for c := range r.clients {
		wg.Go(func() {
			var buf bytes.Buffer
			for n := 0; ctx.Err() == nil; n++ {
				now := time.Now()
				if now.After(end) {
					return
				}
				buf.Reset()
				writeIngressBody(&buf, prefix, c, n, r.batch)
				t0 := time.Now()
				err := postIngress(ctx, client, path, buf.Bytes())
				d := time.Since(t0)
				if err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
				total.Add(int64(r.batch))
				if t0.After(measureFrom) && t0.Before(end) {
					lat.add(d)
					requests.Add(1)
					events.Add(int64(r.batch))
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return ingressHTTPResult{}, fmt.Errorf("%s: %w", r.name, firstErr)
	}
	if err := ctx.Err(); err != nil {
		return ingressHTTPResult{}, err
	}
	return ingressHTTPResult{run: r, events: events.Load(), requests: requests.Load(), total: total.Load(),
		elapsed: r.dur, lat: lat.summary()}, nil
}

func writeIngressBody(buf *bytes.Buffer, prefix string, client, n, batch int) {
	event := func(i int) {
		buf.WriteString(`{"id":"`)
		buf.WriteString(prefix)
		buf.WriteByte('-')
		buf.WriteString(strconv.Itoa(client))
		buf.WriteByte('-')
		buf.WriteString(strconv.Itoa(n))
		buf.WriteByte('-')
		buf.WriteString(strconv.Itoa(i))
		buf.WriteString(`","source":"bench","type":"order.created","data":{"order":`)
		buf.WriteString(strconv.Itoa(n))
		buf.WriteString(`,"amount":1250,"currency":"EUR"}}`)
	}
	if batch == 1 {
		event(0)
		return
	}
	buf.WriteString(`{"events":[`)
	for i := range batch {
		if i > 0 {
			buf.WriteByte(',')
		}
		event(i)
	}
	buf.WriteString(`]}`)
}

func postIngress(ctx context.Context, client *http.Client, url string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusAccepted {
		return errors.New("status " + resp.Status + ": " + string(b))
	}
	return nil
}
