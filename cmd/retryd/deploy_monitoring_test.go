package main

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const monitoringDir = deployDir + "/monitoring"

// registeredMetrics reads every metric retryd registers from the sources of
// the services, the stores, the internal packages and the SDK: the
// promreg.Builder calls (name under the builder's namespace and
// subsystem), the prometheus.*Opts literals (also inside a helper such as
// triggers' counter(name, help, labels...)) and prometheus.NewDesc. It
// returns each full name with its label names; a histogram's _bucket, _sum
// and _count series are listed too (the bucket with le).
//
// The registries themselves cannot be built cheaply: each metrics
// constructor is unexported and runs inside New with a pool and a NATS
// connection, and a vector's series only appear once used.
func registeredMetrics(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	add := func(name string, labels []string, histogram bool) {
		out[name] = labels
		if histogram {
			out[name+"_bucket"] = append(slices.Clone(labels), "le")
			out[name+"_sum"] = labels
			out[name+"_count"] = labels
		}
	}
	for _, root := range []string{"../../services", "../../stores", "../../internal", "../../pkg"} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
			if err != nil {
				return err
			}
			for _, decl := range f.Decls {
				if fn, ok := decl.(*ast.FuncDecl); ok && fn.Body != nil {
					metricsInFunc(t, path, fn.Body, add)
				}
			}
			return nil
		})
		require.NoError(t, err)
	}
	return out
}

// metricsInFunc finds the metrics one function body declares.
func metricsInFunc(t *testing.T, path string, body *ast.BlockStmt, add func(string, []string, bool)) {
	builders := map[string][2]string{} // builder variable: namespace, subsystem
	helpers := map[string]helperOpts{} // func literal variable: what it builds
	ast.Inspect(body, func(n ast.Node) bool {
		as, ok := n.(*ast.AssignStmt)
		if !ok || len(as.Lhs) != 1 || len(as.Rhs) != 1 {
			return true
		}
		id, ok := as.Lhs[0].(*ast.Ident)
		if !ok {
			return true
		}
		switch rhs := as.Rhs[0].(type) {
		case *ast.CompositeLit:
			if sel, ok := rhs.Type.(*ast.SelectorExpr); ok && sel.Sel.Name == "Builder" {
				f := litFields(rhs)
				builders[id.Name] = [2]string{f["Namespace"], f["Subsystem"]}
			}
		case *ast.FuncLit:
			// A helper building one metric from its parameters:
			// counter(name, help string, labels ...string).
			ast.Inspect(rhs.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok || !isProm(call.Fun) {
					return true
				}
				for _, a := range call.Args {
					if cl, ok := a.(*ast.CompositeLit); ok && isOpts(cl) {
						f := litFields(cl)
						helpers[id.Name] = helperOpts{ns: f["Namespace"], sub: f["Subsystem"],
							histogram: strings.Contains(selName(call.Fun), "Histogram")}
					}
				}
				return true
			})
		}
		return true
	})
	ast.Inspect(body, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		switch fun := call.Fun.(type) {
		case *ast.SelectorExpr:
			if x, ok := fun.X.(*ast.Ident); ok {
				if b, ok := builders[x.Name]; ok && len(call.Args) >= 2 {
					name := strLit(call.Args[0])
					require.NotEmpty(t, name, "%s: a metric of builder %s is not named by a literal", path, x.Name)
					var labels []string
					if strings.HasSuffix(fun.Sel.Name, "Vec") {
						labels = strLits(call.Args[2:])
					}
					add(b[0]+"_"+b[1]+"_"+name, labels, strings.HasPrefix(fun.Sel.Name, "Histogram"))
					return true
				}
			}
			if !isProm(fun) {
				return true
			}
			if fun.Sel.Name == "NewDesc" {
				var labels []string
				if len(call.Args) >= 3 {
					if cl, ok := call.Args[2].(*ast.CompositeLit); ok {
						labels = strLits(cl.Elts)
					}
				}
				add(strLit(call.Args[0]), labels, false)
				return true
			}
			if len(call.Args) == 0 {
				return true
			}
			cl, ok := call.Args[0].(*ast.CompositeLit)
			if !ok || !isOpts(cl) {
				return true
			}
			f := litFields(cl)
			if f["Name"] == "" { // built by a helper from its parameters
				return true
			}
			var labels []string
			if len(call.Args) >= 2 {
				if l, ok := call.Args[1].(*ast.CompositeLit); ok {
					labels = strLits(l.Elts)
				}
			}
			add(prometheusName(f["Namespace"], f["Subsystem"], f["Name"]), labels, strings.Contains(fun.Sel.Name, "Histogram"))
		case *ast.Ident:
			if h, ok := helpers[fun.Name]; ok && len(call.Args) >= 2 {
				name := strLit(call.Args[0])
				require.NotEmpty(t, name, "%s: a metric of helper %s is not named by a literal", path, fun.Name)
				add(prometheusName(h.ns, h.sub, name), strLits(call.Args[2:]), h.histogram)
			}
		}
		return true
	})
}

type helperOpts struct {
	ns, sub   string
	histogram bool
}

func prometheusName(ns, sub, name string) string {
	var parts []string
	for _, p := range []string{ns, sub, name} {
		if p != "" {
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, "_")
}

func isProm(e ast.Expr) bool {
	sel, ok := e.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	x, ok := sel.X.(*ast.Ident)
	return ok && x.Name == "prometheus"
}

func selName(e ast.Expr) string {
	if sel, ok := e.(*ast.SelectorExpr); ok {
		return sel.Sel.Name
	}
	return ""
}

func isOpts(cl *ast.CompositeLit) bool {
	return isProm(cl.Type) && strings.HasSuffix(selName(cl.Type), "Opts")
}

// litFields returns the string-literal fields of a composite literal.
func litFields(cl *ast.CompositeLit) map[string]string {
	out := map[string]string{}
	for _, e := range cl.Elts {
		if kv, ok := e.(*ast.KeyValueExpr); ok {
			if k, ok := kv.Key.(*ast.Ident); ok {
				out[k.Name] = strLit(kv.Value)
			}
		}
	}
	return out
}

func strLit(e ast.Expr) string {
	if bl, ok := e.(*ast.BasicLit); ok && bl.Kind == token.STRING {
		s, err := strconv.Unquote(bl.Value)
		if err == nil {
			return s
		}
	}
	return ""
}

func strLits(es []ast.Expr) []string {
	var out []string
	for _, e := range es {
		if s := strLit(e); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func TestRegisteredMetricsAreFound(t *testing.T) {
	t.Parallel()
	m := registeredMetrics(t)
	// Each way of declaring a metric is seen, with its labels.
	for name, labels := range map[string][]string{
		"retryd_scheduler_pending":                     {"kind", "state"},
		"retryd_scheduler_due_lateness_seconds_bucket": {"le"},
		"retryd_scheduler_outbox_lag_seconds":          nil,
		"retryd_outbox_lag_seconds":                    {"owner"},
		"retryd_ingress_retries_total":                 {"source", "event"},
		"retryd_triggers_runs_failed_total":            {"trigger_id", "class"},
		"retryd_triggers_reconciled_total":             nil,
		"retryd_triggers_held_deliveries":              {"trigger_id", "status"},
		"retryd_worker_attempts_total":                 {"job_type", "outcome"},
		"retryd_worker_attempt_duration_seconds_count": {"job_type", "outcome"},
		"retryd_jobs_bulk_retry_items_total":           {"result"},
	} {
		require.Contains(t, m, name)
		require.ElementsMatch(t, labels, m[name], name)
	}
	require.Greater(t, len(m), 70, "every metric is found (77 with histogram series, November 2026)")
}

// promqlNames are the retryd metrics an expression names.
var (
	promqlMetric   = regexp.MustCompile(`\bretryd_[a-z0-9_]+\b`)
	promqlString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promqlSelector = regexp.MustCompile(`\b(retryd_[a-z0-9_]+)\s*\{([^}]*)\}`)
	promqlMatcher  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
	promqlGrouping = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	legendLabel    = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)
	labelValues    = regexp.MustCompile(`label_values\(\s*(retryd_[a-z0-9_]+)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)`)
)

// targetLabels are added by Prometheus to every series it scrapes.
var targetLabels = []string{"job", "instance"}

// checkPromQL checks that expr names only registered retryd metrics, and
// labels those metrics have, in its selectors, its by/without clauses and
// in legend (a Grafana legend format, may be empty). It returns the
// metric names.
func checkPromQL(t *testing.T, where, expr, legend string, registered map[string][]string) []string {
	t.Helper()
	bare := promqlString.ReplaceAllString(expr, `""`)
	names := promqlMetric.FindAllString(bare, -1)
	require.NotEmpty(t, names, "%s: %q names no retryd metric", where, expr)
	var all []string
	for _, n := range names {
		labels, ok := registered[n]
		require.True(t, ok, "%s: %s is not a metric retryd registers", where, n)
		all = append(all, labels...)
	}
	all = append(all, targetLabels...)
	for _, m := range promqlSelector.FindAllStringSubmatch(bare, -1) {
		for _, l := range promqlMatcher.FindAllStringSubmatch(m[2], -1) {
			require.Contains(t, append(slices.Clone(registered[m[1]]), targetLabels...), l[1], "%s: %s has no label %s", where, m[1], l[1])
		}
	}
	for _, g := range promqlGrouping.FindAllStringSubmatch(bare, -1) {
		for _, l := range strings.Split(g[1], ",") {
			if l = strings.TrimSpace(l); l != "" {
				require.Contains(t, all, l, "%s: no metric of %q has the label %s", where, expr, l)
			}
		}
	}
	for _, l := range legendLabel.FindAllStringSubmatch(legend, -1) {
		require.Contains(t, all, l[1], "%s: legend %q names %s, a label %q does not have", where, legend, l[1], expr)
	}
	for _, lv := range labelValues.FindAllStringSubmatch(bare, -1) {
		require.Contains(t, registered[lv[1]], lv[2], "%s: %s has no label %s", where, lv[1], lv[2])
	}
	return names
}

func TestGrafanaDashboard(t *testing.T) {
	t.Parallel()
	registered := registeredMetrics(t)
	raw, err := os.ReadFile(filepath.Join(monitoringDir, "grafana", "retryd.json"))
	require.NoError(t, err)
	var dash struct {
		UID           string `json:"uid"`
		Title         string `json:"title"`
		SchemaVersion int    `json:"schemaVersion"`
		Templating    struct {
			List []struct {
				Name       string          `json:"name"`
				Type       string          `json:"type"`
				Query      json.RawMessage `json:"query"`
				Definition string          `json:"definition"`
				Datasource *datasourceRef  `json:"datasource"`
			} `json:"list"`
		} `json:"templating"`
		Panels []dashboardPanel `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(raw, &dash))
	require.Equal(t, "retryd", dash.UID)
	require.GreaterOrEqual(t, dash.SchemaVersion, 39)

	// A datasource variable of type prometheus, which every panel and
	// query uses; other variables query through it.
	vars := map[string]bool{}
	for _, v := range dash.Templating.List {
		vars[v.Name] = true
		switch v.Type {
		case "datasource":
			require.Equal(t, "datasource", v.Name)
			require.JSONEq(t, `"prometheus"`, string(v.Query))
		case "query":
			require.NotNil(t, v.Datasource, "variable %s", v.Name)
			require.Equal(t, datasourceRef{Type: "prometheus", UID: "${datasource}"}, *v.Datasource, "variable %s", v.Name)
			checkPromQL(t, "variable "+v.Name, v.Definition, "", registered)
		}
	}
	require.True(t, vars["datasource"], "a datasource variable")

	used := map[string]bool{}
	var panels []dashboardPanel
	for _, p := range dash.Panels {
		panels = append(panels, p)
		panels = append(panels, p.Panels...) // a collapsed row's panels
	}
	ids := map[int]bool{}
	for _, p := range panels {
		require.False(t, ids[p.ID], "panel id %d is unique", p.ID)
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		require.NotEmpty(t, p.Title, "panel %d", p.ID)
		require.NotNil(t, p.Datasource, "panel %q has a datasource", p.Title)
		require.Equal(t, datasourceRef{Type: "prometheus", UID: "${datasource}"}, *p.Datasource, "panel %q", p.Title)
		require.NotEmpty(t, p.Targets, "panel %q has targets", p.Title)
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			require.NotEmpty(t, tg.Expr, "panel %q", p.Title)
			require.False(t, refs[tg.RefID], "panel %q: refId %s is unique", p.Title, tg.RefID)
			refs[tg.RefID] = true
			if tg.Datasource != nil {
				require.Equal(t, *p.Datasource, *tg.Datasource, "panel %q", p.Title)
			}
			for _, v := range regexp.MustCompile(`\$([a-z_]+)`).FindAllStringSubmatch(tg.Expr, -1) {
				require.True(t, vars[v[1]] || strings.HasPrefix(v[1], "__"), "panel %q uses $%s, which is no variable", p.Title, v[1])
			}
			for _, n := range checkPromQL(t, "panel "+strconv.Quote(p.Title), tg.Expr, tg.LegendFormat, registered) {
				used[n] = true
			}
		}
	}
	// What the dashboard is for (issue 20) is on it.
	for _, n := range []string{
		"retryd_scheduler_pending",                                       // retries by state
		"retryd_scheduler_due_lateness_seconds_bucket",                   // due lateness
		"retryd_scheduler_due_total", "retryd_scheduler_succeeded_total", // cycle rate
		"retryd_scheduler_exhausted_total",                   // exhausted by kind
		"retryd_scheduler_policy_lag_seconds",                // consumer lag
		"retryd_outbox_pending", "retryd_outbox_lag_seconds", // outbox backlog
		"retryd_triggers_held_deliveries", "retryd_scheduler_releases_pending", // holds
		"retryd_triggers_runs_failed_total", "retryd_triggers_runs_retried_total", // run retries
	} {
		require.True(t, used[n], "the dashboard shows %s", n)
	}
}

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type dashboardPanel struct {
	ID         int            `json:"id"`
	Type       string         `json:"type"`
	Title      string         `json:"title"`
	Datasource *datasourceRef `json:"datasource"`
	Targets    []struct {
		RefID        string         `json:"refId"`
		Expr         string         `json:"expr"`
		LegendFormat string         `json:"legendFormat"`
		Datasource   *datasourceRef `json:"datasource"`
	} `json:"targets"`
	Panels []dashboardPanel `json:"panels"`
}

// githubAnchor is the anchor GitHub gives a Markdown heading.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9'):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func TestPrometheusRules(t *testing.T) {
	t.Parallel()
	registered := registeredMetrics(t)
	doc, err := os.ReadFile("../../docs/operations.md")
	require.NoError(t, err)
	anchors := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#+ (.+)$`).FindAllStringSubmatch(string(doc), -1) {
		anchors[githubAnchor(m[1])] = true
	}

	docs := readYAML(t, filepath.Join(monitoringDir, "prometheus", "retryd-rules.yaml"))
	require.Len(t, docs, 1)
	var alerts []string
	used := map[string]bool{}
	for _, g := range dig(t, docs[0], "groups").([]any) {
		for _, r := range dig(t, g, "rules").([]any) {
			rule := r.(map[string]any)
			name, _ := rule["alert"].(string)
			require.NotEmpty(t, name, "every rule is an alert: %v", rule)
			alerts = append(alerts, name)
			require.NotEmpty(t, rule["for"], "%s has a for", name)
			require.Contains(t, []string{"warning", "critical"}, dig(t, rule, "labels", "severity"), name)
			for _, a := range []string{"summary", "description"} {
				require.NotEmpty(t, dig(t, rule, "annotations", a), "%s: %s", name, a)
			}
			// The runbook is the alert's own heading in docs/operations.md.
			runbook := dig(t, rule, "annotations", "runbook_url").(string)
			const prefix = "https://github.com/retryd/retryd/blob/main/docs/operations.md#"
			require.True(t, strings.HasPrefix(runbook, prefix), "%s: runbook %s", name, runbook)
			require.Equal(t, strings.ToLower(name), strings.TrimPrefix(runbook, prefix), name)
			require.True(t, anchors[strings.TrimPrefix(runbook, prefix)], "%s: docs/operations.md has a heading %s", name, name)
			for _, n := range checkPromQL(t, "alert "+name, dig(t, rule, "expr").(string), "", registered) {
				used[n] = true
			}
		}
	}
	require.ElementsMatch(t, []string{"RetrydExhaustedSpike", "RetrydDueLatenessHigh", "RetrydConsumerLagGrowing",
		"RetrydOutboxBacklog", "RetrydSchedulerAbsent", "RetrydStreamNearLimit"}, alerts)

	// The promtool tests (scripts/lint runs them) have a case where each
	// alert fires and one where it does not.
	tests := readYAML(t, filepath.Join(monitoringDir, "prometheus", "retryd-rules.test.yaml"))
	require.Len(t, tests, 1)
	require.Equal(t, []string{"retryd-rules.yaml"}, strs(t, dig(t, tests[0], "rule_files")))
	firing, quiet := map[string]bool{}, map[string]bool{}
	for _, c := range dig(t, tests[0], "tests").([]any) {
		for _, series := range dig(t, c, "input_series").([]any) {
			s := dig(t, series, "series").(string)
			if n := promqlMetric.FindString(s); n != "" {
				require.Contains(t, registered, n, "test series %s", s)
			}
		}
		for _, a := range dig(t, c, "alert_rule_test").([]any) {
			name := dig(t, a, "alertname").(string)
			if len(dig(t, a, "exp_alerts").([]any)) > 0 {
				firing[name] = true
			} else {
				quiet[name] = true
			}
		}
	}
	for _, a := range alerts {
		require.True(t, firing[a], "a test where %s fires", a)
		require.True(t, quiet[a], "a test where %s does not fire", a)
	}
}
