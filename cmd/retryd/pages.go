package main

import (
	"context"
	"encoding/json"
	"net/url"
)

// fetchPages GETs a list route a page at a time: one page, or, with all,
// every page until the API names no next cursor. rows picks a page's
// items and its next cursor. single is the answer as it came when one
// page was read (--json prints it untouched); next is the cursor after
// the last page read.
func fetchPages[P, R any](ctx context.Context, c *apiClient, path string, q url.Values, all bool,
	rows func(P) ([]R, string)) (items []R, single json.RawMessage, next string, err error) {
	pages := 0
	for {
		var page P
		raw, err := c.get(ctx, path, q, &page)
		if err != nil {
			return nil, nil, "", err
		}
		pages++
		got, cursor := rows(page)
		items, next, single = append(items, got...), cursor, raw
		if !all || next == "" {
			break
		}
		q.Set("cursor", next)
	}
	if pages > 1 {
		single = nil
	}
	return items, single, next, nil
}
