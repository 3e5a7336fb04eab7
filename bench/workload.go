package main

import "time"

// Retry kinds the bench uses, each with its own fixed-delay policy (no
// jitter, so every system waits exactly the same time).
const (
	kindCycle  = "bench" // cycles: 100 ms
	kindProbe  = "probe" // lateness probe: 1 s
	kindBG     = "bg"    // background pending rows loaded with COPY
	kindBurst  = "burst" // burst rows loaded with COPY
	cycleDelay = 100 * time.Millisecond
	probeDelay = time.Second
)
