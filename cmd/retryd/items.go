package main

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// What the jobs and runs commands say and send alike about one item:
// its retry budget, its last error, the errors that name it, how show
// reads it and how a manual action is sent.

// idErr names the item id in err unless the API's message does already.
func idErr(what, id string, err error) error {
	var ae *apiError
	if errors.As(err, &ae) && strings.Contains(ae.Message, id) {
		return fmt.Errorf("%s: %w", what, err)
	}
	return fmt.Errorf("%s %s: %w", what, id, err)
}

// retriesCell is retries used out of the budget, for a list's RETRIES
// column; before the scheduler's first decision the budget is not known
// and the count shows alone.
func retriesCell(used int, budget *int) string {
	if budget == nil {
		return strconv.Itoa(used)
	}
	return fmt.Sprintf("%d/%d", used, *budget)
}

// budgetPairs are a show command's lines on the retry budget: retries
// used (of how many, once known), and that retries are off for this
// noun when they are.
func budgetPairs(used int, budget *int, enabled bool, noun string) []string {
	pairs := []string{"Retries used", strconv.Itoa(used)}
	if budget != nil {
		pairs[1] = retriesUsed(used, *budget)
	}
	if !enabled {
		pairs = append(pairs, "Retries", "disabled for this "+noun)
	}
	return pairs
}

// lastErrorPairs are a show command's lines on the last error: its class
// and message, and when, each when there is one.
func lastErrorPairs(class, message string, at *time.Time, now time.Time) []string {
	var pairs []string
	if class != "" || message != "" {
		pairs = append(pairs, "Last error", strings.TrimPrefix(class+": "+message, ": "))
	}
	if at != nil {
		pairs = append(pairs, "Last error at", stamp(at, now))
	}
	return pairs
}

// actionBody is a manual action's request: the reason and a budget reset
// only when given, so the API applies its own defaults.
func actionBody(reason string, reset bool) map[string]any {
	body := map[string]any{}
	if reason != "" {
		body["reason"] = reason
	}
	if reset {
		body["reset_attempts"] = true
	}
	return body
}

// send POSTs body to path for a command that acts, as fetch GETs: with
// --json it prints the answer as it came and reports done, as it does on
// an error (passed through fail); otherwise the caller prints out its
// own way.
func (g *globals) send(cmd *cobra.Command, path string, body, out any, fail func(error) error) (done bool, err error) {
	return g.request(cmd, http.MethodPost, path, nil, body, out, fail)
}

// showByID is the RunE of a show command: GET path+ID into a V and show
// it, or, with --json, the answer as it came; what names the item in
// errors.
func showByID[V any](g *globals, path, what string, show func(id string, v V) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, a []string) error {
		id := a[0]
		var v V
		if done, err := g.fetch(cmd, path+seg(id), nil, &v, func(err error) error { return idErr("show "+what, id, err) }); done {
			return err
		}
		return show(id, v)
	}
}
