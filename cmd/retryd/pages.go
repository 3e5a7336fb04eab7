package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/spf13/cobra"
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

// pager is a list command's paging flags: --limit (1 to max), --cursor
// and --all.
type pager struct {
	limit  int
	cursor string
	all    bool
	max    int
}

func addPager(cmd *cobra.Command, max int) *pager {
	p := &pager{max: max}
	f := cmd.Flags()
	f.IntVar(&p.limit, "limit", 100, fmt.Sprintf("page size (1-%d)", max))
	f.StringVar(&p.cursor, "cursor", "", "continue after a previous page")
	f.BoolVar(&p.all, "all", false, "fetch every page")
	return p
}

// check refuses a limit out of range, and a cursor with --all, which
// starts at the first page.
func (p *pager) check(cmd *cobra.Command) error {
	if p.limit < 1 || p.limit > p.max {
		return usageErrorf(cmd, "--limit must be between 1 and %d, got %d", p.max, p.limit)
	}
	if p.all && p.cursor != "" {
		return usageErrorf(cmd, "--cursor and --all exclude each other: --all starts at the first page")
	}
	return nil
}

// filterQuery is the query of a list's filters: each value given, under
// its API name; an empty one is left out, so the API applies no filter.
func filterQuery(filters map[string]string) url.Values {
	q := url.Values{}
	for k, v := range filters {
		if v != "" {
			q.Set(k, v)
		}
	}
	return q
}

// listing says what a list command lists and how it prints it.
type listing[P, R any] struct {
	path string
	// what names the items in errors; none is printed when nothing
	// matches; more names them in the hint of the next page.
	what, none, more string
	rows             func(P) ([]R, string)
	page             func([]R) P
	// columns head the table; row gives an item's cells under them, with
	// times relative to now.
	columns []string
	row     func(r R, now time.Time) []string
}

// list reads the pages of l.path with q and the pager's limit and
// cursor, and prints them: as JSON (the page as it came, or every row in
// one page with --all), or as a table of l's columns followed, on stderr,
// by how to read the next page.
func list[P, R any](cmd *cobra.Command, g *globals, p *pager, q url.Values, l listing[P, R]) error {
	if err := p.check(cmd); err != nil {
		return err
	}
	q.Set("limit", strconv.Itoa(p.limit))
	if p.cursor != "" {
		q.Set("cursor", p.cursor)
	}
	c, err := g.client()
	if err != nil {
		return err
	}
	rows, single, next, err := fetchPages(cmd.Context(), c, l.path, q, p.all, l.rows)
	if err != nil {
		return fmt.Errorf("list %s: %w", l.what, err)
	}
	if g.json {
		if single != nil {
			return printJSON(g.stdout, single)
		}
		return writeJSON(g.stdout, l.page(rows))
	}
	if len(rows) == 0 {
		fmt.Fprintln(g.stdout, l.none)
		return nil
	}
	now := time.Now()
	t := newTable(g.stdout, l.columns...)
	for _, r := range rows {
		t.row(l.row(r, now)...)
	}
	if err := t.flush(); err != nil {
		return err
	}
	if next != "" {
		fmt.Fprintf(g.stderr, "More %s: add --cursor %s (or --all).\n", l.more, next)
	}
	return nil
}
