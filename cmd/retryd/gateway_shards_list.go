package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"

	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/stores/pgdb"
	"github.com/retryd/retryd/stores/retrystore"
)

// shardDone marks, in the gateway's list cursor, a shard whose list has
// been read to its end. A shard's own cursor is base64url and never "~".
const shardDone = "~"

// defaultListLimit is the scheduler's page size when ?limit= is not given.
const defaultListLimit = 100

// encodeShardCursor is the opaque cursor of a list merged across shards:
// base64url of a JSON array holding, for each shard in order, "" (not
// read yet), shardDone, or the cursor its next page starts after.
func encodeShardCursor(states []string) string {
	b, _ := json.Marshal(states) //nolint:errchkjson // a []string always encodes
	return base64.RawURLEncoding.EncodeToString(b)
}

// decodeShardCursor reads a cursor encodeShardCursor made for n shards;
// anything else (another shard count included: the list must start
// again after the shards change) is pgdb.ErrBadCursor, a 400 as
// the scheduler answers for a cursor it did not make.
func decodeShardCursor(c string, n int) ([]string, error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return nil, pgdb.ErrBadCursor
	}
	var states []string
	if json.Unmarshal(b, &states) != nil || len(states) != n {
		return nil, pgdb.ErrBadCursor
	}
	open := false
	for _, st := range states {
		if st == "" || st == shardDone {
			open = open || st == ""
			continue
		}
		if _, _, err := retrystore.ParseListCursor(st); err != nil {
			return nil, pgdb.ErrBadCursor
		}
		open = true
	}
	if !open {
		return nil, pgdb.ErrBadCursor
	}
	return states, nil
}

// shardPage is one shard's page of GET /v1/retries: each retry as the
// shard wrote it, and its kind and id to merge by.
type shardPage struct {
	Retries    []json.RawMessage `json:"retries"`
	NextCursor string            `json:"next_cursor"`
	keys       [][2]string
}

func readShardPage(body []byte) (shardPage, error) {
	var p shardPage
	if err := json.Unmarshal(body, &p); err != nil {
		return p, fmt.Errorf("decode list page: %w", err)
	}
	p.keys = make([][2]string, len(p.Retries))
	for i, raw := range p.Retries {
		var key struct {
			Kind string `json:"kind"`
			ID   string `json:"id"`
		}
		if err := json.Unmarshal(raw, &key); err != nil {
			return p, fmt.Errorf("decode listed retry: %w", err)
		}
		p.keys[i] = [2]string{key.Kind, key.ID}
	}
	return p, nil
}

// serveList answers GET /v1/retries from every shard: each shard's next
// page under the same filters, merged by kind then id as one scheduler
// orders its list, cut to the page size. The cursor carries, per shard,
// where its list resumes: after the last retry the page took from it,
// so a retry a page left out comes on a later one. The order is that of
// Go strings (bytes); it is a shard's order when the database collates
// as "C" or the ids compare alike either way (retryd's ULIDs do; ids
// mixing case or '-' and '_' may come in another order under a locale's
// collation, though every retry still comes exactly once).
func (s *schedulerShards) serveList(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		s.home.ServeHTTP(w, r)
		return
	}
	q := r.URL.Query()
	n := len(s.urls)
	limit := defaultListLimit
	if v, err := strconv.Atoi(q.Get("limit")); err == nil && v >= 1 && v <= retrystore.MaxListLimit {
		limit = v // else every shard refuses it, and that refusal is the answer
	}
	states := make([]string, n)
	if c := q["cursor"]; len(c) == 1 && c[0] != "" {
		var err error
		if states, err = decodeShardCursor(c[0], n); err != nil {
			serve.ReplyPage(w, nil, err)
			return
		}
	}
	var open []int
	for k, st := range states {
		if st != shardDone {
			open = append(open, k)
		}
	}
	replies := s.fanOut(open, func(k int) shardReply {
		sq := maps.Clone(q) // Set and Del replace entries, never change q's
		if len(sq["cursor"]) <= 1 {
			sq.Del("cursor")
			if states[k] != "" {
				sq.Set("cursor", states[k])
			}
		}
		return s.send(r, k, r.URL.Path, sq.Encode(), nil)
	})
	pages := make([]shardPage, n)
	for _, rep := range replies {
		switch {
		case rep.err != nil:
			s.unreachable(w, r, rep)
			return
		case rep.status/100 == 4:
			rep.write(w) // the caller's mistake, as every shard sees it
			return
		case rep.status != http.StatusOK:
			writeBadGateway(w, fmt.Sprintf("scheduler shard %d answered the list with %s", rep.shard, rep.describe()))
			return
		}
		p, err := readShardPage(rep.body)
		if err != nil {
			s.log.Warn().Err(err).Int("shard", rep.shard).Msg("scheduler shard answered a list the gateway cannot read")
			writeBadGateway(w, fmt.Sprintf("scheduler shard %d answered the list with a body the gateway cannot read", rep.shard))
			return
		}
		pages[rep.shard] = p
	}
	merged, next := mergePages(pages, states, open, limit)
	serve.WriteJSON(w, http.StatusOK, struct {
		Retries    []json.RawMessage `json:"retries"`
		NextCursor string            `json:"next_cursor,omitempty"`
	}{merged, next})
}

// mergePages takes up to limit retries from the pages of the open
// shards, smallest kind and id first, and returns them with the cursor
// of the next page, "" when every shard's list has been read to its end.
// An item on two shards (during a resharding, a fact that reached its
// new shard while its old one still holds its row) comes once, as its
// shard now has it, which is what GET /v1/retries/{kind}/{id} answers.
// Each shard's page holds limit rows, so an item a page takes is never
// after a row of a shard's list that page did not fetch.
func mergePages(pages []shardPage, states []string, open []int, limit int) ([]json.RawMessage, string) {
	taken := make([]int, len(pages))
	head := func(k int) ([2]string, bool) {
		if taken[k] == len(pages[k].keys) {
			return [2]string{}, false
		}
		return pages[k].keys[taken[k]], true
	}
	merged := make([]json.RawMessage, 0, limit)
	for len(merged) < limit {
		best := -1
		var key [2]string
		for _, k := range open {
			if h, ok := head(k); ok && (best < 0 || lessKey(h, key)) {
				best, key = k, h
			}
		}
		if best < 0 {
			break
		}
		pick, now := best, contract.Shard(key[0], key[1], len(pages))
		var same []int
		for _, k := range open {
			if h, ok := head(k); ok && h == key {
				same = append(same, k)
				if k == now {
					pick = k
				}
			}
		}
		merged = append(merged, pages[pick].Retries[taken[pick]])
		for _, k := range same {
			taken[k]++
		}
	}
	next := slices.Clone(states)
	more := false
	for _, k := range open {
		p := pages[k]
		switch {
		case taken[k] == len(p.Retries) && p.NextCursor == "":
			next[k] = shardDone
		case taken[k] == len(p.Retries):
			next[k] = p.NextCursor
		case taken[k] > 0:
			last := p.keys[taken[k]-1]
			next[k] = retrystore.ListCursor(last[0], last[1])
		}
		more = more || next[k] != shardDone
	}
	if !more {
		return merged, ""
	}
	return merged, encodeShardCursor(next)
}

func lessKey(a, b [2]string) bool {
	if a[0] != b[0] {
		return a[0] < b[0]
	}
	return a[1] < b[1]
}
