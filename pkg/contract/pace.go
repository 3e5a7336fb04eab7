package contract

import (
	"fmt"
	"time"
)

// ReleasePace spreads a release over an owner's rate windows: the item of
// rank i in the release (from 0, in the order the items were first held)
// comes due at SlotAt(i) instead of at once. An owner that admits at most
// Limit items per window (a source's rate limit) sends the slots it gave
// the held items, so each comes due once, at its turn, and the release
// runs at the limit instead of waking every item at once.
type ReleasePace struct {
	// From is the start of the first window of the release.
	From time.Time `json:"from"`
	// Skip is how many slots of the first window were taken before the
	// release (admissions of that window so far).
	Skip int `json:"skip,omitempty"`
	// Limit is how many items a window admits.
	Limit int `json:"limit"`
	// WindowMS is the length of a window in milliseconds.
	WindowMS int64 `json:"window_ms"`
}

// Bounds of a pace: those of a source's rate limit.
const (
	MaxPaceLimit  = 1_000_000_000
	MaxPaceWindow = 366 * 24 * time.Hour
)

// Window is the pace's window length.
func (p ReleasePace) Window() time.Duration { return time.Duration(p.WindowMS) * time.Millisecond }

// SlotSpacing is the time between two slots of a window of length w that
// admits limit items: w/limit in whole microseconds, at least one. Slots
// are then exact at a database's precision, so an item that comes back at
// its slot does not look a fraction early.
func SlotSpacing(w time.Duration, limit int) time.Duration {
	return max((w / time.Duration(max(limit, 1))).Truncate(time.Microsecond), time.Microsecond)
}

// SlotAt is when the item of rank i of the release comes due: slot
// (Skip+i) mod Limit of the window (Skip+i) div Limit windows after From.
func (p ReleasePace) SlotAt(i int) time.Time {
	g := int64(p.Skip) + int64(i)
	limit := int64(max(p.Limit, 1))
	return p.From.Add(time.Duration(g/limit)*p.Window() + time.Duration(g%limit)*SlotSpacing(p.Window(), p.Limit)).UTC()
}

// PaceQuantum groups a paced release's dues: the items whose slots fall
// in the same PaceQuantum of a window come due together, at its start, a
// microsecond apart in rank order, so a release at 10,000 a second costs
// the scheduler about 100 emissions a second, not 10,000. An item may then
// come due up to PaceQuantum before its slot; the owner keeps its line
// (an item does not pass the ones ahead of it).
const PaceQuantum = 10 * time.Millisecond

// DueAt is when the scheduler brings the item of rank i back: at the
// start of the PaceQuantum (of its window) that holds SlotAt(i), plus its
// place among the slots of that quantum in microseconds. Never after
// SlotAt(i), never in another window, and in rank order.
func (p ReleasePace) DueAt(i int) time.Time {
	g := int64(p.Skip) + int64(i)
	limit := int64(max(p.Limit, 1))
	sp := SlotSpacing(p.Window(), p.Limit)
	pos := g % limit
	bucket := (time.Duration(pos) * sp).Truncate(min(PaceQuantum, p.Window()))
	first := int64((bucket + sp - 1) / sp)
	return p.From.Add(time.Duration(g/limit)*p.Window() + bucket + time.Duration(pos-first)*time.Microsecond).UTC()
}

// Validate checks a pace.
func (p ReleasePace) Validate() error {
	switch {
	case p.From.IsZero():
		return fieldErr("data.pace.from", "is required")
	case p.Limit < 1 || p.Limit > MaxPaceLimit:
		return fieldErr("data.pace.limit", fmt.Sprintf("must be between 1 and %d, got %d", MaxPaceLimit, p.Limit))
	case p.WindowMS < 1 || p.Window() > MaxPaceWindow:
		return fieldErr("data.pace.window_ms", fmt.Sprintf("must be between 1 and %d, got %d", MaxPaceWindow.Milliseconds(), p.WindowMS))
	case p.Skip < 0 || p.Skip >= p.Limit:
		return fieldErr("data.pace.skip", fmt.Sprintf("must be between 0 and limit-1 (%d), got %d", p.Limit-1, p.Skip))
	}
	return nil
}
