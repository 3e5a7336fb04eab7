package contract

import (
	"fmt"
	"strings"
)

// Priority is a job's priority band (seed 004's `priority`). There are
// three bands; a job without one is normal. Each band has its own subject
// on JOBS (see JobSubjectFor), so a worker can take the higher bands first
// with JetStream alone: one pull consumer per band, the higher one
// fetched first whenever a slot is free.
type Priority string

// The priority bands, highest first.
const (
	PriorityHigh   Priority = "high"
	PriorityNormal Priority = "normal"
	PriorityLow    Priority = "low"
)

// Priorities lists the bands in the order a worker starts them.
var Priorities = []Priority{PriorityHigh, PriorityNormal, PriorityLow}

// Band is the band p stands for: empty (not set) is normal.
func (p Priority) Band() Priority {
	if p == "" {
		return PriorityNormal
	}
	return p
}

// Valid reports whether p is empty or one of the bands.
func (p Priority) Valid() bool {
	switch p {
	case "", PriorityHigh, PriorityNormal, PriorityLow:
		return true
	}
	return false
}

// ValidatePriority checks a priority: empty (normal) or high, normal or
// low, exactly as written (no other case, no numbers).
func ValidatePriority(field string, p Priority) error {
	if p.Valid() {
		return nil
	}
	return fieldErr(field, fmt.Sprintf("%q is not a priority: use high, normal or low (or leave it out for normal)", truncateReason(string(p))))
}

// ParsePriority reads a priority given by a person (an API query, a CLI
// flag): high, normal or low in any case, blank for normal.
func ParsePriority(field, s string) (Priority, error) {
	p := Priority(strings.ToLower(strings.TrimSpace(s)))
	if err := ValidatePriority(field, p); err != nil {
		return "", err
	}
	return p.Band(), nil
}

// truncateReason keeps an echoed value short in an error message.
func truncateReason(s string) string {
	if len(s) <= 64 {
		return s
	}
	n := 64
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n] + "…"
}

// JobSubjectFor is the subject of a job of jobType in band p: the normal
// band (and no priority) is "jobs.<job_type>", as before priorities, and
// the others add their band: "jobs.<job_type>.high", "jobs.<job_type>.low".
func JobSubjectFor(jobType string, p Priority) string {
	switch p.Band() {
	case PriorityHigh, PriorityLow:
		return "jobs." + jobType + "." + string(p)
	}
	return JobSubject(jobType)
}
