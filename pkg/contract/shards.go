package contract

import (
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
)

// MaxShards caps the number of scheduler shards RETRIES may be split
// into: each shard is a Postgres database and a set of consumers, and the
// shard token must stay short in every stored subject.
const MaxShards = 1024

// Shard is the shard of the item kind/id when RETRIES is split into n
// shards: FNV-1a of kind and id, as the server's partition(n,1,3) subject
// mapping hashes tokens 1 and 3 of retry.<kind>.<event>.<id>, modulo n.
// Every lifecycle event of an item therefore lands on one shard; n below
// 2 is one shard, 0.
func Shard(kind, id string, n int) int {
	if n < 2 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(kind))
	_, _ = h.Write([]byte(id))
	return int(h.Sum32() % uint32(n))
}

// ShardsOf are the shards the item kind/id may be on when RETRIES is
// split into n: its shard now, then its shard under each smaller count
// that divides n, largest first, each once. A resharding only multiplies
// the count (N to kN), so those are the layouts that may have placed it,
// and until a split moves it the item sits on its old shard: what looks
// an item up (the gateway, the jobs API) tries them in this order.
func ShardsOf(kind, id string, n int) []int {
	out := []int{Shard(kind, id, n)}
	for d := n - 1; d >= 1; d-- {
		if n%d != 0 {
			continue
		}
		if k := Shard(kind, id, d); !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out
}

// RetryShardTransform is the RETRIES stream's subject transform for n
// shards: the server appends the item's shard as a fifth token, so
// retry.job.failed.j1 is stored as retry.job.failed.j1.<Shard("job", "j1", n)>.
// Publishers keep publishing four tokens; core subscribers see what was
// published. Source and destination, as in StreamConfig.SubjectTransform.
func RetryShardTransform(n int) (src, dest string) {
	return "retry.*.*.*", fmt.Sprintf("retry.{{wildcard(1)}}.{{wildcard(2)}}.{{wildcard(3)}}.{{partition(%d,1,3)}}", n)
}

// ParseRetryShardTransform returns the shard count of a RETRIES subject
// transform destination written by RetryShardTransform, and false for
// any other (or none).
func ParseRetryShardTransform(dest string) (int, bool) {
	var n int
	if _, err := fmt.Sscanf(dest, "retry.{{wildcard(1)}}.{{wildcard(2)}}.{{wildcard(3)}}.{{partition(%d,1,3)}}", &n); err != nil {
		return 0, false
	}
	if _, want := RetryShardTransform(n); want != dest || n < 1 || n > MaxShards {
		return 0, false
	}
	return n, true
}

// RetryShardFilter is the filter of one lifecycle event of every kind on
// one shard of a split RETRIES: retry.*.<event>.*.<shard>. Shard 0 also
// owns the subjects stored before the split (four tokens): see
// RetryFilter for those.
func RetryShardFilter(ev Lifecycle, shard int) string {
	return "retry.*." + string(ev) + ".*." + strconv.Itoa(shard)
}

// ValidateShards checks a shard count and, when shards is above 1, the
// index of one shard in it, naming the fields.
func ValidateShards(shardsField string, shards int, shardField string, shard int) error {
	if shards < 0 || shards > MaxShards {
		return fieldErr(shardsField, fmt.Sprintf("must be between 1 and %d, got %d", MaxShards, shards))
	}
	if shard < 0 || (shards > 0 && shard >= shards) || (shards == 0 && shard != 0) {
		return fieldErr(shardField, fmt.Sprintf("must be between 0 and %d (%s - 1), got %d", max(shards, 1)-1, shardsField, shard))
	}
	return nil
}
