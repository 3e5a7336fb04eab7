package contract_test

import (
	"fmt"
	"time"

	"github.com/retryd/retryd/pkg/contract"
)

// An owner reports that attempt 1 of an event failed. The message carries a
// deterministic Nats-Msg-Id, so publishing it twice stores it once.
func ExampleNewLifecycleMsg() {
	failedAt := time.Date(2025, 3, 14, 15, 9, 26, 0, time.UTC)
	msg, err := contract.NewLifecycleMsg("my-service", contract.Failed, contract.FailedData{
		Kind:       contract.KindEvent,
		ID:         "01JQ7Z3K5WEXAMPLE",
		Attempt:    1,
		Error:      contract.ErrorInfo{Class: "rate_limit", Message: "429 from upstream"},
		RetryAfter: contract.RetryAfterDuration(30 * time.Second),
	}, failedAt)
	if err != nil {
		panic(err)
	}
	fmt.Println(msg.Subject)
	fmt.Println(msg.Header.Get(contract.HeaderMsgID))
	fmt.Println(string(msg.Data))
	// Output:
	// retry.event.failed.01JQ7Z3K5WEXAMPLE
	// event-failed:01JQ7Z3K5WEXAMPLE:1
	// {"specversion":"1.0","id":"event-failed:01JQ7Z3K5WEXAMPLE:1","source":"my-service","type":"retry.failed","time":"2025-03-14T15:09:26Z","subject":"event/01JQ7Z3K5WEXAMPLE","datacontenttype":"application/json","data":{"kind":"event","id":"01JQ7Z3K5WEXAMPLE","attempt":1,"error":{"class":"rate_limit","message":"429 from upstream"},"retry_after":30}}
}

// The scheduler's due event for attempt 3 of a trigger delivery has a
// deterministic id; owners dedupe on it.
func ExampleDueMsgID() {
	id := contract.DueMsgID(contract.KindEventTrigger, "01JQ7Z3K5WDELIVERY", 3)
	fmt.Println(id)
	kind, item, attempt, err := contract.ParseDueMsgID(id)
	fmt.Println(kind, item, attempt, err)
	// Output:
	// event-trigger-retry:01JQ7Z3K5WDELIVERY:3
	// event-trigger 01JQ7Z3K5WDELIVERY 3 <nil>
}

// Decoding is strict and errors name the field.
func ExampleDecodeLifecycle() {
	body := []byte(`{"specversion":"1.0","id":"event-failed:e1:1","source":"worker","type":"retry.failed",` +
		`"time":"2025-03-14T15:09:26Z","data":{"kind":"event","id":"e1","attempt":"1"}}`)
	_, err := contract.DecodeLifecycle("retry.event.failed.e1", body)
	fmt.Println(err)
	// Output:
	// data is not valid: field "attempt" must be an integer, got string
}

func ExampleRetryItemFilter() {
	fmt.Println(contract.RetryItemFilter(contract.KindJob, "01JQ7Z3K5WJOB"))
	fmt.Println(contract.RetryFilter("*", contract.Due))
	// Output:
	// retry.job.*.01JQ7Z3K5WJOB
	// retry.*.due.>
}
