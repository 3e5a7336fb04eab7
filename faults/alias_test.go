package faults_test

import "github.com/nats-io/nats.go"

type natsMsg = nats.Msg
