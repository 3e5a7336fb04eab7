package worker_test

import (
	"fmt"

	"github.com/retryd/retryd/pkg/worker"
)

// A multi-step handler records its progress after each step; on a retry
// the checkpoint tells it where to start.
func ExampleJob_SetCheckpoint() {
	job := &worker.Job{ID: "01JA2Q8M9X3T7V5W6Y4Z2B1C0D", Type: "onboarding", Attempt: 1}
	_ = job.SetCheckpoint(map[string]string{"step": "create_account"})

	var cp struct{ Step string }
	ok, _ := job.DecodeCheckpoint(&cp)
	fmt.Println(ok, cp.Step)
	fmt.Println(string(job.Checkpoint))
	// Output:
	// true create_account
	// {"step":"create_account"}
}

// The idempotency key is the same for every delivery of one attempt and
// changes with each retry: key external effects with it.
func ExampleJob_IdempotencyKey() {
	first := &worker.Job{ID: "01JA2Q8M9X3T7V5W6Y4Z2B1C0D", Attempt: 1}
	retry := &worker.Job{ID: "01JA2Q8M9X3T7V5W6Y4Z2B1C0D", Attempt: 2}
	fmt.Println(first.IdempotencyKey())
	fmt.Println(retry.IdempotencyKey())
	// Output:
	// 01JA2Q8M9X3T7V5W6Y4Z2B1C0D:1
	// 01JA2Q8M9X3T7V5W6Y4Z2B1C0D:2
}
