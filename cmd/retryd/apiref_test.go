package main

import (
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"
)

// apiRefPath is the API reference rendered from the spec.
const apiRefPath = "../../docs/api.md"

var updateAPIReference = flag.Bool("update", false, "rewrite docs/api.md from docs/openapi.yaml")

// docs/api.md is docs/openapi.yaml rendered: it fails when the spec
// changed and the page was not rendered again (go test ./cmd/retryd/ -run
// TestAPIReference -update).
func TestAPIReference(t *testing.T) {
	t.Parallel()
	got := renderAPIReference(loadSpec(t))
	if *updateAPIReference {
		require.NoError(t, os.WriteFile(apiRefPath, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(apiRefPath)
	require.NoError(t, err)
	if got == string(want) {
		return
	}
	// The first line that differs says enough; the whole page would not.
	gotLines, wantLines := strings.Split(got, "\n"), strings.Split(string(want), "\n")
	line := 0
	for line < min(len(gotLines), len(wantLines)) && gotLines[line] == wantLines[line] {
		line++
	}
	at := func(lines []string) string {
		if line < len(lines) {
			return lines[line]
		}
		return "(end of page)"
	}
	t.Fatalf("docs/api.md is stale (go test ./cmd/retryd/ -run TestAPIReference -update): line %d is\n\t%s\nbut the spec renders\n\t%s",
		line+1, at(wantLines), at(gotLines))
}

var methodOrder = []string{"GET", "POST", "PUT", "PATCH", "DELETE"}

// specOp is an operation with its method and path.
type specOp struct {
	method, path string
	item         *openapi3.PathItem
	op           *openapi3.Operation
}

// opsByTag lists the operations of each tag, by path then method.
func opsByTag(doc *openapi3.T) map[string][]specOp {
	out := map[string][]specOp{}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			out[op.Tags[0]] = append(out[op.Tags[0]], specOp{method, path, item, op})
		}
	}
	for _, ops := range out {
		slices.SortFunc(ops, func(a, b specOp) int {
			if a.path != b.path {
				return strings.Compare(a.path, b.path)
			}
			return slices.Index(methodOrder, a.method) - slices.Index(methodOrder, b.method)
		})
	}
	return out
}

func renderAPIReference(doc *openapi3.T) string {
	var w strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&w, format, args...) }
	p("# API reference\n\n")
	p("<!-- Generated from openapi.yaml by `go test ./cmd/retryd/ -run TestAPIReference -update`: edit the spec, not this page. -->\n\n")
	p("%s\n\n", doc.Info.Summary)
	p("%s\n", strings.TrimSpace(doc.Info.Description))
	p("\nThe machine-readable contract is [openapi.yaml](openapi.yaml) (OpenAPI %s).\n\n", doc.OpenAPI)
	byTag := opsByTag(doc)
	p("## Routes\n\n| Method | Path | Role | Summary |\n| --- | --- | --- | --- |\n")
	for _, tag := range doc.Tags {
		for _, o := range byTag[tag.Name] {
			p("| %s | [`%s`](#%s) | %s | %s |\n", o.method, o.path, githubAnchor(o.method+" "+o.path), o.op.Extensions[roleExtension], cell(o.op.Summary))
		}
	}
	for _, tag := range doc.Tags {
		p("\n## %s\n\n%s\n", tag.Name, tag.Description)
		for _, o := range byTag[tag.Name] {
			renderOperation(&w, o)
		}
	}
	p("\n## Schemas\n")
	for _, name := range slices.Sorted(maps.Keys(doc.Components.Schemas)) {
		renderSchema(&w, name, doc.Components.Schemas[name].Value)
	}
	return w.String()
}

func renderOperation(w *strings.Builder, o specOp) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("\n### %s %s\n\n%s\n", o.method, o.path, o.op.Summary)
	if d := strings.TrimSpace(o.op.Description); d != "" {
		p("\n%s\n", d)
	}
	p("\nRole: `%s`.\n", o.op.Extensions[roleExtension])
	params := slices.Concat(o.item.Parameters, o.op.Parameters)
	if len(params) > 0 {
		p("\n| Parameter | In | Type | Description |\n| --- | --- | --- | --- |\n")
		for _, pr := range params {
			v := pr.Value
			name := "`" + v.Name + "`"
			if v.Required {
				name += " (required)"
			}
			p("| %s | %s | %s | %s |\n", name, v.In, typeOf(v.Schema), cell(v.Description))
		}
	}
	if rb := o.op.RequestBody; rb != nil {
		need := "optional"
		if rb.Value.Required {
			need = "required"
		}
		for _, mt := range slices.Sorted(maps.Keys(rb.Value.Content)) {
			p("\nRequest body (%s, %s): %s\n", mt, need, typeOf(rb.Value.Content[mt].Schema))
		}
	}
	p("\n| Status | Body | Description |\n| --- | --- | --- |\n")
	responses := o.op.Responses.Map()
	for _, status := range slices.Sorted(maps.Keys(responses)) {
		r := responses[status].Value
		body := "none"
		for _, mt := range slices.Sorted(maps.Keys(r.Content)) {
			body = typeOf(r.Content[mt].Schema)
			if mt != "application/json" {
				body += " (" + mt + ")"
			}
		}
		p("| %s | %s | %s |\n", status, body, cell(*r.Description))
	}
}

func renderSchema(w *strings.Builder, name string, s *openapi3.Schema) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("\n### %s\n\n", name)
	if s.Description != "" {
		p("%s\n\n", s.Description)
	}
	if len(s.Properties) == 0 {
		p("%s\n", typeOf(openapi3.NewSchemaRef("", s)))
		return
	}
	if s.AdditionalProperties.Has != nil && !*s.AdditionalProperties.Has {
		p("No other fields are accepted.\n\n")
	}
	p("| Field | Type | Description |\n| --- | --- | --- |\n")
	for _, prop := range slices.Sorted(maps.Keys(s.Properties)) {
		field := "`" + prop + "`"
		if slices.Contains(s.Required, prop) {
			field += " (required)"
		}
		p("| %s | %s | %s |\n", field, typeOf(s.Properties[prop]), cell(s.Properties[prop].Value.Description))
	}
}

// typeOf names a schema: a link to a component, or its shape.
func typeOf(r *openapi3.SchemaRef) string {
	if r == nil {
		return "any"
	}
	if r.Ref != "" {
		name := r.Ref[strings.LastIndex(r.Ref, "/")+1:]
		return "[" + name + "](#" + githubAnchor(name) + ")"
	}
	s := r.Value
	var parts []string
	switch {
	case len(s.AllOf) > 0:
		return joinTypes(s.AllOf, " and ")
	case len(s.OneOf) > 0:
		return joinTypes(s.OneOf, " or ")
	case s.Const != nil:
		return fmt.Sprintf("`%v`", s.Const)
	}
	for _, t := range s.Type.Slice() {
		switch t {
		case "array":
			parts = append(parts, "array of "+typeOf(s.Items))
		case "object":
			parts = append(parts, objectShape(s))
		default:
			parts = append(parts, t)
		}
	}
	if len(parts) == 0 {
		return "any"
	}
	out := strings.Join(parts, " or ")
	if len(s.Enum) > 0 {
		var vals []string
		for _, v := range s.Enum {
			if v != nil {
				vals = append(vals, fmt.Sprint(v))
			}
		}
		out += ": " + strings.Join(vals, ", ")
	}
	if s.Format != "" {
		out += " (" + s.Format + ")"
	}
	return out
}

func joinTypes(refs openapi3.SchemaRefs, sep string) string {
	var parts []string
	for _, r := range refs {
		parts = append(parts, typeOf(r))
	}
	return strings.Join(parts, sep)
}

// objectShape writes an inline object as {field: type, …} or a map.
func objectShape(s *openapi3.Schema) string {
	if len(s.Properties) == 0 {
		if ap := s.AdditionalProperties.Schema; ap != nil {
			return "map of " + typeOf(ap)
		}
		return "object"
	}
	var fields []string
	for _, name := range slices.Sorted(maps.Keys(s.Properties)) {
		fields = append(fields, name+": "+typeOf(s.Properties[name]))
	}
	return "{" + strings.Join(fields, ", ") + "}"
}

// cell makes text fit a table cell.
func cell(s string) string {
	return strings.ReplaceAll(strings.Join(strings.Fields(s), " "), "|", `\|`)
}
