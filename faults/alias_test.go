package faults_test

import (
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

type natsMsg = nats.Msg

func jetstreamNew(nc *nats.Conn) (jetstream.JetStream, error) { return jetstream.New(nc) }
