package main

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/auth"
	"github.com/retryd/retryd/pkg/policy"
)

// cliView is a type the CLI decodes an answer of a route into.
type cliView struct {
	method, path string
	status       int
	view         any
}

// cliViews is what the CLI reads of each route it calls (client.go,
// views.go and the commands): the types the routes themselves encode,
// under the CLI's names. The spec is checked against these types, not a
// generated client, which would be a second definition of each answer.
var cliViews = []cliView{
	{"GET", "/v1/retries", 200, retryPage{}},
	{"GET", "/v1/retries/{kind}/{id}", 200, retryView{}},
	{"POST", "/v1/retries/{kind}/{id}/cancel", 200, retryView{}},
	{"POST", "/v1/retries/{kind}/{id}/retry", 200, retryView{}},
	{"GET", "/v1/policies", 200, policyList{}},
	{"GET", "/v1/policies/{kind}/{job_type}", 200, policy.Policy{}},
	{"PUT", "/v1/policies/{kind}/{job_type}", 200, policy.Policy{}},
	{"PUT", "/v1/policies/{kind}/{job_type}", 201, policy.Policy{}},
	{"GET", "/v1/policies/{kind}/{job_type}/versions", 200, policyVersionList{}},
	{"GET", "/v1/sources", 200, sourceList{}},
	{"GET", "/v1/sources/{source}", 200, sourceView{}},
	{"PUT", "/v1/sources/{source}", 200, sourceView{}},
	{"POST", "/v1/sources/{source}/pause", 200, sourceView{}},
	{"POST", "/v1/sources/{source}/resume", 200, sourceView{}},
	{"GET", "/v1/analytics/retries", 200, analyticsView{}},
	{"GET", "/v1/jobs", 200, jobPage{}},
	{"GET", "/v1/jobs/{id}", 200, jobView{}},
	{"POST", "/v1/jobs/{id}/retry", 202, jobActionView{}},
	{"POST", "/v1/jobs/{id}/cancel", 202, jobActionView{}},
	{"POST", "/v1/jobs", 202, enqueued{}},
	{"POST", "/v1/jobs", 200, enqueued{}},
	{"GET", "/v1/schedules", 200, scheduleList{}},
	{"GET", "/v1/schedules/{job_type}/{name}", 200, scheduleView{}},
	{"PUT", "/v1/schedules/{job_type}/{name}", 200, scheduleView{}},
	{"POST", "/v1/jobs/bulk-retry", 200, dryRunView{}},
	{"POST", "/v1/jobs/bulk-retry", 202, operationView{}},
	{"GET", "/v1/operations", 200, operationPage{}},
	{"GET", "/v1/operations/{id}", 200, operationView{}},
	{"POST", "/v1/operations/{id}/cancel", 200, operationView{}},
	{"GET", "/v1/runs", 200, runPage{}},
	{"GET", "/v1/runs/{id}", 200, runView{}},
	{"GET", "/v1/audit", 200, auditPage{}},
	{"POST", "/v1/tokens", 201, auth.Created{}},
	{"GET", "/v1/tokens", 200, tokenList{}},
	{"DELETE", "/v1/tokens/{id}", 200, auth.Token{}},
}

// Every JSON field the CLI reads from an answer is in the spec's schema of
// that answer, at the same place: renaming a field on either side fails
// here.
func TestOpenAPIHoldsCLIViews(t *testing.T) {
	t.Parallel()
	doc := loadSpec(t)
	for _, v := range cliViews {
		name := v.method + " " + v.path
		item := doc.Paths.Value(v.path)
		require.NotNil(t, item, "%s is not in the spec", name)
		op := item.GetOperation(v.method)
		require.NotNil(t, op, "%s is not in the spec", name)
		resp := op.Responses.Status(v.status)
		require.NotNil(t, resp, "%s answers no %d in the spec", name, v.status)
		media := resp.Value.Content.Get("application/json")
		require.NotNil(t, media, "%s %d has no JSON body in the spec", name, v.status)
		for _, miss := range missingFields(reflect.TypeOf(v.view), media.Schema.Value, reflect.TypeOf(v.view).Name()) {
			t.Errorf("%s %d: the CLI reads %s, which the spec's answer does not have", name, v.status, miss)
		}
	}
}

var (
	timeType      = reflect.TypeFor[time.Time]()
	rawType       = reflect.TypeFor[json.RawMessage]()
	marshalerType = reflect.TypeFor[json.Marshaler]()
)

// missingFields lists the JSON fields of t (where names it) that schema s
// does not have, walking into nested structs, slices and maps.
func missingFields(t reflect.Type, s *openapi3.Schema, where string) []string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == timeType || t == rawType:
		return nil
	case t.Kind() == reflect.Struct && t.Implements(marshalerType):
		// A type with its own JSON form (policy.Policy): its fields are
		// what it writes.
		return missingKeys(t, s, where)
	}
	var miss []string
	switch t.Kind() {
	case reflect.Struct:
		props := properties(s)
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if f.Anonymous && name == "" {
				miss = append(miss, missingFields(f.Type, s, where)...)
				continue
			}
			if name == "-" {
				continue
			}
			if name == "" {
				name = f.Name
			}
			p, ok := props[name]
			if !ok {
				miss = append(miss, where+"."+name)
				continue
			}
			miss = append(miss, missingFields(f.Type, p, where+"."+name)...)
		}
	case reflect.Slice, reflect.Array:
		if items := variant(s, func(v *openapi3.Schema) *openapi3.SchemaRef { return v.Items }); items != nil {
			miss = missingFields(t.Elem(), items, where+"[]")
		}
	case reflect.Map:
		if ap := variant(s, func(v *openapi3.Schema) *openapi3.SchemaRef { return v.AdditionalProperties.Schema }); ap != nil {
			miss = missingFields(t.Elem(), ap, where+"{}")
		}
	}
	return miss
}

// missingKeys lists the keys of the JSON t's zero value writes that s
// does not have.
func missingKeys(t reflect.Type, s *openapi3.Schema, where string) []string {
	b, err := json.Marshal(reflect.New(t).Interface())
	if err != nil {
		return []string{where + ": " + err.Error()}
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(b, &keys); err != nil {
		return []string{where + ": " + err.Error()}
	}
	props := properties(s)
	var miss []string
	for k := range keys {
		if _, ok := props[k]; !ok {
			miss = append(miss, where+"."+k)
		}
	}
	slices.Sort(miss)
	return miss
}

// properties are the properties of s and of the schemas it combines
// (allOf, and the object variants of oneOf and anyOf).
func properties(s *openapi3.Schema) map[string]*openapi3.Schema {
	out := map[string]*openapi3.Schema{}
	for name, p := range s.Properties {
		out[name] = p.Value
	}
	for _, group := range []openapi3.SchemaRefs{s.AllOf, s.OneOf, s.AnyOf} {
		for _, sub := range group {
			for name, p := range properties(sub.Value) {
				out[name] = p
			}
		}
	}
	return out
}

// variant returns what pick finds on s or on the first variant of its
// oneOf or anyOf that has it (a status that is a string or a list).
func variant(s *openapi3.Schema, pick func(*openapi3.Schema) *openapi3.SchemaRef) *openapi3.Schema {
	if r := pick(s); r != nil {
		return r.Value
	}
	for _, sub := range slices.Concat(s.OneOf, s.AnyOf, s.AllOf) {
		if r := variant(sub.Value, pick); r != nil {
			return r
		}
	}
	return nil
}

// The check itself fails on a renamed field.
func TestOpenAPICLIViewsCheckCatchesARename(t *testing.T) {
	t.Parallel()
	doc := loadSpec(t)
	schema := doc.Components.Schemas["RetryPage"].Value
	type renamed struct {
		Retries []struct {
			Attempts int `json:"attempts"`
		} `json:"retries"`
		Next string `json:"next"`
	}
	require.Equal(t, []string{"renamed.retries[].attempts", "renamed.next"}, missingFields(reflect.TypeFor[renamed](), schema, "renamed"))
}
