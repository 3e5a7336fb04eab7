package triggers

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/migrations/pgtest"
)

func TestTriggerAPI(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	in := TriggerInput{Name: "Big invoices", Source: "billing", EventType: "invoice.paid", Predicate: "data.amount > 100",
		Throttle: &ThrottleInput{Limit: new(10), Window: "1m", Key: "data.customer_id"}, MaxConcurrency: new(3), Workflow: "onboard"}
	created := b.createTrigger(t, in)
	require.Len(t, created.ID, 26, "a ULID is generated")
	require.Equal(t, 1, created.Version)
	require.True(t, created.Enabled)
	require.Equal(t, &ThrottleView{Limit: 10, Window: "1m0s", WindowMS: 60000, Key: "data.customer_id"}, created.Throttle)
	require.Equal(t, 3, created.MaxConcurrency)

	var got TriggerView
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/v1/triggers/"+created.ID, nil, &got))
	require.Equal(t, created, got)

	// PUT replaces the definition; enabled left out keeps the state.
	in.Predicate, in.Throttle, in.MaxConcurrency = "", nil, nil
	require.Equal(t, http.StatusOK, b.do(t, http.MethodPut, "/v1/triggers/"+created.ID, in, &got))
	require.Equal(t, 2, got.Version)
	require.Nil(t, got.Throttle)
	require.Zero(t, got.MaxConcurrency)
	require.Equal(t, http.StatusOK, b.do(t, http.MethodPut, "/v1/triggers/"+created.ID, in, &got))
	require.Equal(t, 2, got.Version, "an identical PUT is not a change")

	require.Equal(t, http.StatusOK, b.do(t, http.MethodPost, "/v1/triggers/"+created.ID+"/disable", nil, &got))
	require.False(t, got.Enabled)
	require.Equal(t, 3, got.Version)
	require.Equal(t, http.StatusOK, b.do(t, http.MethodPut, "/v1/triggers/"+created.ID, in, &got))
	require.False(t, got.Enabled, "PUT without enabled keeps a disabled trigger disabled")
	require.Equal(t, http.StatusOK, b.do(t, http.MethodPost, "/v1/triggers/"+created.ID+"/enable", nil, &got))
	require.True(t, got.Enabled)
	require.Equal(t, 4, got.Version)

	other := b.createTrigger(t, TriggerInput{ID: "zz-other", Name: "other", Source: "crm", EventType: "lead.created", Workflow: "enrich"})
	var list struct {
		Triggers []TriggerView `json:"triggers"`
		Next     string        `json:"next"`
	}
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/v1/triggers?limit=1", nil, &list))
	require.Len(t, list.Triggers, 1)
	require.Equal(t, created.ID, list.Triggers[0].ID)
	require.Equal(t, created.ID, list.Next)
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/v1/triggers?after="+list.Next, nil, &list))
	require.Len(t, list.Triggers, 1)
	require.Equal(t, other.ID, list.Triggers[0].ID)
	require.Empty(t, list.Next)
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/v1/triggers?source=crm&enabled=true", nil, &list))
	require.Len(t, list.Triggers, 1)

	require.Equal(t, http.StatusNoContent, b.do(t, http.MethodDelete, "/v1/triggers/"+created.ID, nil, nil))
	var e apiError
	require.Equal(t, http.StatusNotFound, b.do(t, http.MethodGet, "/v1/triggers/"+created.ID, nil, &e))
	require.Equal(t, "not_found", e.Error.Code)
	require.Contains(t, e.Error.Message, created.ID)
	require.Equal(t, http.StatusNotFound, b.do(t, http.MethodDelete, "/v1/triggers/"+created.ID, nil, nil))
	require.Equal(t, http.StatusNotFound, b.do(t, http.MethodPut, "/v1/triggers/"+created.ID, in, nil))
	require.Equal(t, http.StatusNotFound, b.do(t, http.MethodPost, "/v1/triggers/"+created.ID+"/enable", nil, nil))

	var versions struct {
		Versions []VersionView `json:"versions"`
	}
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/v1/triggers/"+created.ID+"/versions", nil, &versions))
	require.Len(t, versions.Versions, 5, "create, put, disable, enable, delete (the PUT without a change made none)")
	require.Equal(t, "data.amount > 100", versions.Versions[0].Predicate)
	require.NotNil(t, versions.Versions[0].Throttle)
	require.False(t, versions.Versions[2].Enabled)
	require.True(t, versions.Versions[3].Enabled)
	require.True(t, versions.Versions[4].Deleted)

	// The audit trail has one entry per version, none for the PUT that
	// changed nothing or for the refused ones after the delete.
	entries := pgtest.Strings(t, b.pool, `SELECT principal || ' ' || action || ' @' || (detail->>'version')
		FROM audit_log WHERE target = $1 ORDER BY id`, "trigger/"+created.ID)
	require.Equal(t, []string{"local trigger.create @1", "local trigger.update @2", "local trigger.disable @3",
		"local trigger.enable @4", "local trigger.delete @5"}, entries)

	e = apiError{}
	require.Equal(t, http.StatusConflict, b.do(t, http.MethodPost, "/v1/triggers", TriggerInput{ID: other.ID, Name: "dup", Source: "crm", EventType: "lead.created", Workflow: "enrich"}, &e))
	require.Equal(t, "conflict", e.Error.Code)

	var deliveries struct {
		Deliveries []DeliveryView `json:"deliveries"`
	}
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/v1/triggers/"+other.ID+"/deliveries", nil, &deliveries))
	require.Empty(t, deliveries.Deliveries)
	require.Equal(t, http.StatusNotFound, b.do(t, http.MethodGet, "/v1/triggers/nope/deliveries", nil, nil))
	require.Equal(t, http.StatusNotFound, b.do(t, http.MethodGet, "/v1/deliveries/nope", nil, nil))
	require.Equal(t, http.StatusNotFound, b.do(t, http.MethodGet, "/v1/nothing-here", nil, nil))
}

func TestTriggerAPIRefusesInvalidDefinitions(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	cases := []struct {
		body   string
		status int
		field  string
		text   string
	}{
		{`{"name":"x","source":"billing","event_type":"invoice.paid","workflow":"w","predicate":"data.amount >"}`, 400, "predicate", "not a valid CEL expression"},
		{`{"name":"x","source":"billing","event_type":"invoice.paid","workflow":"w","predicate":"data.amount + 1"}`, 400, "predicate", "must return bool"},
		{`{"name":"x","source":"billing","event_type":"invoice.paid","workflow":"w","predicate":"` + doublingPredicate(18) + `"}`, 400, "predicate",
			"nests comprehensions (all, exists, exists_one, map, filter) 18 deep, more than the limit of 3"},
		{`{"name":"x","source":"billing","event_type":"invoice.paid","workflow":"w","predicate":"` + doublingPredicate(40) + `"}`, 400, "predicate",
			"40 deep, more than the limit of 3"},
		{`{"name":"x","source":"billing","event_type":"invoice.paid","workflow":"w","throttle":{"limit":-5,"window":"1m"}}`, 400, "throttle.limit", "between 1 and"},
		{`{"name":"x","source":"billing","event_type":"invoice.paid","workflow":"w","throttle":{"window":"1m"}}`, 400, "throttle.limit", "required when throttle.window"},
		{`{"name":"x","source":"billing","event_type":"invoice.paid","workflow":"w","throttle":{"limit":5,"window":"soon"}}`, 400, "throttle.window", "not a duration"},
		{`{"name":"x","source":"billing","event_type":"invoice.paid","workflow":"w","max_concurrency":0}`, 400, "max_concurrency", "between 1 and"},
		{`{"name":"x","source":"billing","event_type":"invoice.paid","workflow":"w","max_concurrency":-2}`, 400, "max_concurrency", "got -2"},
		{`{"name":"x","source":"billing","event_type":"invoice.paid","workflow":"w","run_timeout":"soon"}`, 400, "run_timeout", "not a duration"},
		{`{"name":"x","source":"billing","event_type":"invoice.paid","workflow":"w","run_timeout":"500ms"}`, 400, "run_timeout", "between 1s and 168h0m0s"},
		{`{"name":"x","source":"billing","event_type":"invoice.paid","workflow":"w","run_timeout":"8d"}`, 400, "run_timeout", "not a duration"},
		{`{"name":"x","source":"billing","event_type":"invoice.paid","workflow":"w","run_timeout":"200h"}`, 400, "run_timeout", "between"},
		{`{"name":"x","source":"billing","event_type":"invoice.paid","workflow":"w","run_timeout":3600}`, 400, "run_timeout", "string"},
		{`{"name":"x","source":"Bad Source","event_type":"invoice.paid","workflow":"w"}`, 400, "source", "URI-reference"},
		{`{"name":"x","source":"billing","event_type":"invoice.paid","workflow":"a.b"}`, 400, "workflow", "lowercase"},
		{`{"name":"x","source":"billing","event_type":"invoice.paid","workflow":"w","id":"has space"}`, 400, "id", "letters"},
		{`{"name":"x","source":"billing","event_type":"invoice.paid","workflow":"w","colour":"red"}`, 400, "colour", "not a known field"},
		{`{"name":"x","source":"billing","event_type":"invoice.paid","workflow":"w","max_concurrency":"3"}`, 400, "max_concurrency", "an integer"},
		{`{"name":"x"`, 400, "body", "truncated"},
		{``, 400, "body", "empty"},
		{`{"name":"` + strings.Repeat("x", 70<<10) + `"}`, 413, "body", "limit"},
	}
	for _, c := range cases {
		var e apiError
		require.Equal(t, c.status, b.do(t, http.MethodPost, "/v1/triggers", c.body, &e), c.body)
		require.Equal(t, c.field, e.Error.Field, c.body)
		require.Contains(t, e.Error.Message, c.text, c.body)
	}
	var list struct {
		Triggers []TriggerView `json:"triggers"`
	}
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/v1/triggers", nil, &list))
	require.Empty(t, list.Triggers, "nothing invalid was saved")

	created := b.createTrigger(t, TriggerInput{ID: "t1", Name: "x", Source: "billing", EventType: "invoice.paid", Workflow: "w"})
	var e apiError
	require.Equal(t, http.StatusBadRequest, b.do(t, http.MethodPut, "/v1/triggers/t1", `{"name":"x","source":"billing","event_type":"invoice.paid","workflow":"w","predicate":"1"}`, &e))
	require.Equal(t, "predicate", e.Error.Field)
	require.Equal(t, http.StatusBadRequest, b.do(t, http.MethodPut, "/v1/triggers/t1", `{"id":"t2","name":"x","source":"billing","event_type":"invoice.paid","workflow":"w"}`, &e))
	require.Equal(t, "id", e.Error.Field)
	var got TriggerView
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/v1/triggers/t1", nil, &got))
	require.Equal(t, created.Version, got.Version, "a refused change changes nothing")
	require.Equal(t, http.StatusBadRequest, b.do(t, http.MethodGet, "/v1/triggers?limit=0", nil, &e))
	require.Equal(t, "limit", e.Error.Field)
	require.Equal(t, http.StatusBadRequest, b.do(t, http.MethodGet, "/v1/triggers/t1/deliveries?status=weird", nil, &e))
	require.Equal(t, "status", e.Error.Field)
}
