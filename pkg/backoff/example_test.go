package backoff_test

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/retryd/retryd/pkg/backoff"
)

// The default job schedule: doubling from 2h, capped at 24h, with up to
// 5 minutes of additive jitter.
func ExampleConfig_Bounds() {
	cfg := backoff.JobDefault()
	for retry := range 6 {
		lo, hi := cfg.Bounds(retry)
		fmt.Printf("retry %d: %v to %v\n", retry+1, lo, hi)
	}
	// Output:
	// retry 1: 2h0m0s to 2h5m0s
	// retry 2: 4h0m0s to 4h5m0s
	// retry 3: 8h0m0s to 8h5m0s
	// retry 4: 16h0m0s to 16h5m0s
	// retry 5: 24h0m0s to 24h5m0s
	// retry 6: 24h0m0s to 24h5m0s
}

func ExampleConfig_BaseDelay() {
	cfg := backoff.Default() // 1s doubling, capped at 5min
	for _, retry := range []int{0, 1, 2, 8, 9, 1_000_000} {
		fmt.Println(retry, cfg.BaseDelay(retry))
	}
	// Output:
	// 0 1s
	// 1 2s
	// 2 4s
	// 8 4m16s
	// 9 5m0s
	// 1000000 5m0s
}

// A seeded source makes jitter reproducible, e.g. in tests or simulations:
// the same seed gives the same schedule.
func ExampleConfig_Delay() {
	cfg := backoff.Config{Base: time.Second, Max: time.Minute, Multiplier: 2, Jitter: backoff.JitterEqual}
	r := rand.New(rand.NewPCG(1, 2))
	for retry := range 4 {
		delay, jitter := cfg.Delay(retry, r)
		fmt.Printf("retry %d: base %v, jitter %v, delay %v\n", retry+1,
			cfg.BaseDelay(retry), jitter.Round(time.Millisecond), delay.Round(time.Millisecond))
	}
	// Output:
	// retry 1: base 1s, jitter -115ms, delay 885ms
	// retry 2: base 2s, jitter -384ms, delay 1.616s
	// retry 3: base 4s, jitter -431ms, delay 3.569s
	// retry 4: base 8s, jitter -814ms, delay 7.186s
}
