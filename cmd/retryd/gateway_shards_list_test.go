package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/stores/retrystore"
)

// page is a shard's page of the items ids (kind job), in order, with the
// cursor a scheduler gives when more follow.
func page(t *testing.T, more bool, ids ...string) shardPage {
	t.Helper()
	var rows []string
	for _, id := range ids {
		rows = append(rows, fmt.Sprintf(`{"kind":"job","id":%q}`, id))
	}
	next := ""
	if more {
		next = retrystore.ListCursor("job", ids[len(ids)-1])
	}
	body, err := json.Marshal(map[string]any{"retries": json.RawMessage("[" + strings.Join(rows, ",") + "]"), "next_cursor": next})
	require.NoError(t, err)
	p, err := readShardPage(body)
	require.NoError(t, err)
	return p
}

func ids(rows []json.RawMessage) []string {
	var out []string
	for _, r := range rows {
		var v struct {
			ID string `json:"id"`
		}
		_ = json.Unmarshal(r, &v)
		out = append(out, v.ID)
	}
	return out
}

// A merged page takes the smallest rows of every shard; each shard's
// cursor resumes after the last row taken from it, and a shard read to
// its end is not asked again.
func TestMergePages(t *testing.T) {
	t.Parallel()
	pages := []shardPage{page(t, true, "A", "C", "E"), page(t, false, "B"), page(t, true, "D", "F", "G")}
	merged, next := mergePages(pages, []string{"", "", ""}, []int{0, 1, 2}, 3)
	require.Equal(t, []string{"A", "B", "C"}, ids(merged))
	states, err := decodeShardCursor(next, 3)
	require.NoError(t, err)
	require.Equal(t, []string{retrystore.ListCursor("job", "C"), shardDone, ""}, states)

	// The last page: every shard read to its end, no cursor.
	merged, next = mergePages([]shardPage{page(t, false, "E"), {}, page(t, false, "F")}, states, []int{0, 2}, 3)
	require.Equal(t, []string{"E", "F"}, ids(merged))
	require.Empty(t, next)
}

// An item on two shards comes once, as its shard now holds it.
func TestMergePagesItemOnTwoShards(t *testing.T) {
	t.Parallel()
	id := ""
	for i := 0; id == ""; i++ {
		if c := fmt.Sprintf("X%d", i); contract.Shard("job", c, 2) == 1 {
			id = c
		}
	}
	old := page(t, false, "A", id)
	old.Retries[1] = json.RawMessage(fmt.Sprintf(`{"kind":"job","id":%q,"state":"scheduled"}`, id))
	now := page(t, false, id)
	now.Retries[0] = json.RawMessage(fmt.Sprintf(`{"kind":"job","id":%q,"state":"cancelled"}`, id))
	merged, next := mergePages([]shardPage{old, now}, []string{"", ""}, []int{0, 1}, 2)
	require.Equal(t, []string{"A", id}, ids(merged))
	require.Contains(t, string(merged[1]), "cancelled")
	require.Empty(t, next)
}

// An item's shards: its shard now, then under each count dividing it.
func TestItemShards(t *testing.T) {
	t.Parallel()
	for i := range 200 {
		id := fmt.Sprintf("01ITEM%03d", i)
		got := contract.ShardsOf("job", id, 4)
		want := []int{contract.Shard("job", id, 4)}
		for _, n := range []int{2, 1} {
			if s := contract.Shard("job", id, n); !slices.Contains(want, s) {
				want = append(want, s)
			}
		}
		require.Equal(t, want, got, id)
		require.Equal(t, []int{0}, contract.ShardsOf("job", id, 1))
		for _, s := range contract.ShardsOf("job", id, 6) {
			require.Less(t, s, 6)
		}
	}
}
