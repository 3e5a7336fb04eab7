package streams

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// Collector exports the size of retryd's streams and of the account's
// JetStream storage, read from the server at each scrape, so that an
// alert sees a stream (or the account) near its limit without the NATS
// exporter. A stream or figure the server does not answer for within the
// scrape's few seconds is left out of that scrape.
type Collector struct {
	js                        jetstream.JetStream
	timeout                   time.Duration
	bytes, messages, maxBytes *prometheus.Desc
	storeBytes, storeMaxBytes *prometheus.Desc
}

// NewCollector returns the collector of js's streams; register it once per
// process (promreg.Register keeps the first).
func NewCollector(js jetstream.JetStream) *Collector {
	return &Collector{
		js:       js,
		timeout:  3 * time.Second,
		bytes:    prometheus.NewDesc("retryd_stream_bytes", "Bytes a retryd stream stores.", []string{"stream"}, nil),
		messages: prometheus.NewDesc("retryd_stream_messages", "Messages a retryd stream stores.", []string{"stream"}, nil),
		maxBytes: prometheus.NewDesc("retryd_stream_max_bytes", "A retryd stream's max_bytes, when it has one.", []string{"stream"}, nil),
		storeBytes: prometheus.NewDesc("retryd_jetstream_storage_bytes",
			"File storage the JetStream account of retryd's streams uses.", nil, nil),
		storeMaxBytes: prometheus.NewDesc("retryd_jetstream_storage_limit_bytes",
			"The JetStream account's file storage limit, when it has one.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.bytes, c.messages, c.maxBytes, c.storeBytes, c.storeMaxBytes} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for _, name := range Names {
		s, err := c.js.Stream(ctx, name)
		if err != nil {
			continue
		}
		info := s.CachedInfo()
		gauge(c.bytes, float64(info.State.Bytes), name)
		gauge(c.messages, float64(info.State.Msgs), name)
		if info.Config.MaxBytes > 0 {
			gauge(c.maxBytes, float64(info.Config.MaxBytes), name)
		}
	}
	ai, err := c.js.AccountInfo(ctx)
	if err != nil {
		return
	}
	gauge(c.storeBytes, float64(ai.Store))
	if ai.Limits.MaxStore > 0 {
		gauge(c.storeMaxBytes, float64(ai.Limits.MaxStore))
	}
}
