package engine

import (
	"encoding/json"
	"fmt"

	"github.com/retryd/retryd/pkg/contract"
)

// Node names, in the order they run. Each node's input is the output of
// the node before it; the first one's is the run's event.
const (
	NodeFetch  = "fetch"
	NodeEnrich = "enrich"
	NodeNotify = "notify"
)

// nodeFunc computes a node's output from its input. execution is the
// node's execution number for the run (1 for its first), counted across
// attempts and restarts. Outputs are deterministic, so a node executed
// again after a crash reports what its first execution would have.
type nodeFunc func(runID string, input json.RawMessage, execution int, failFirst int) (json.RawMessage, *contract.ErrorInfo)

type node struct {
	name string
	run  nodeFunc
}

var nodes = []node{
	{NodeFetch, fetch},
	{NodeEnrich, enrich},
	{NodeNotify, notify},
}

// NodeNames lists the workflow's nodes in order.
func NodeNames() []string {
	out := make([]string, len(nodes))
	for i, n := range nodes {
		out[i] = n.name
	}
	return out
}

func isNode(name string) bool { return nodeIndex(name) >= 0 }

func nodeIndex(name string) int {
	for i, n := range nodes {
		if n.name == name {
			return i
		}
	}
	return -1
}

// fetch stands for reading the record the event names.
func fetch(runID string, input json.RawMessage, _, _ int) (json.RawMessage, *contract.ErrorInfo) {
	if len(input) == 0 {
		input = json.RawMessage(`null`)
	}
	return marshal(map[string]any{"record": "rec-" + runID, "event": input})
}

// enrich stands for a call to a flaky upstream: it fails with a network
// error on its first failFirst executions of a run.
func enrich(_ string, input json.RawMessage, execution, failFirst int) (json.RawMessage, *contract.ErrorInfo) {
	if execution <= failFirst {
		return nil, &contract.ErrorInfo{Class: "network", Message: fmt.Sprintf("enrich: connection reset by peer (execution %d)", execution)}
	}
	return marshal(map[string]any{"tier": "gold", "fetched": input})
}

// notify stands for sending a message built from the enriched record.
func notify(_ string, input json.RawMessage, _, _ int) (json.RawMessage, *contract.ErrorInfo) {
	return marshal(map[string]any{"notified": true, "enriched": input})
}

func marshal(v any) (json.RawMessage, *contract.ErrorInfo) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, &contract.ErrorInfo{Class: "validation", Message: fmt.Sprintf("marshal output: %v", err), NonRetryable: true}
	}
	return b, nil
}
