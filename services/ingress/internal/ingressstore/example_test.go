package ingressstore_test

import (
	"fmt"
	"time"

	"github.com/retryd/retryd/services/ingress/internal/ingressstore"
)

// A pause with an end stops by itself: the gate admits again from
// PausedUntil on.
func ExampleSource_PausedAt() {
	until := time.Date(2025, 6, 1, 2, 0, 0, 0, time.UTC)
	src := ingressstore.Source{Source: "billing", Paused: true, PausedUntil: &until}
	fmt.Println(src.PausedAt(until.Add(-time.Second)), src.PausedAt(until))
	// Output: true false
}

// An empty AllowedTypes allows every type.
func ExampleSource_AllowsType() {
	open := ingressstore.Source{Source: "crm"}
	strict := ingressstore.Source{Source: "billing", AllowedTypes: []string{"invoice.paid"}}
	fmt.Println(open.AllowsType("contact.created"), strict.AllowsType("invoice.paid"), strict.AllowsType("invoice.voided"))
	// Output: true true false
}
