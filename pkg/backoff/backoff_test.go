package backoff_test

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/backoff"
)

// fixedRand returns the same position in every range: 0 for the lowest
// value, -1 for the highest.
type fixedRand int64

func (f fixedRand) Int64N(n int64) int64 {
	if f < 0 {
		return n - 1
	}
	return min(int64(f), n-1)
}

func TestBaseDelay(t *testing.T) {
	t.Parallel()
	linkedin := backoff.Config{Base: time.Hour, Max: 12 * time.Hour, Multiplier: 1.5}
	tests := []struct {
		name  string
		cfg   backoff.Config
		retry int
		want  time.Duration
	}{
		{"default first", backoff.Default(), 0, time.Second},
		{"default second", backoff.Default(), 1, 2 * time.Second},
		{"default ninth", backoff.Default(), 8, 256 * time.Second},
		{"default capped at 5min", backoff.Default(), 9, 5 * time.Minute},
		{"job default first", backoff.JobDefault(), 0, 2 * time.Hour},
		{"job default fourth", backoff.JobDefault(), 3, 16 * time.Hour},
		{"job default capped at 24h", backoff.JobDefault(), 4, 24 * time.Hour},
		{"multiplier 1.5", linkedin, 2, 2*time.Hour + 15*time.Minute},
		{"multiplier 1.5 capped", linkedin, 7, 12 * time.Hour},
		{"negative retry is the first", backoff.Default(), -5, time.Second},
		{"huge retry", backoff.Default(), math.MaxInt, 5 * time.Minute},
		{"retry 1<<40", backoff.JobDefault(), 1 << 40, 24 * time.Hour},
		{"huge retry huge max", backoff.Config{Base: time.Nanosecond, Max: math.MaxInt64, Multiplier: 10}, math.MaxInt, math.MaxInt64},
		{"huge multiplier", backoff.Config{Base: time.Second, Max: time.Hour, Multiplier: math.MaxFloat64}, 3, time.Hour},
		{"multiplier 1 is constant", backoff.Config{Base: time.Second, Max: time.Hour, Multiplier: 1}, 1000, time.Second},
		{"multiplier below 1 is constant", backoff.Config{Base: time.Second, Max: time.Hour, Multiplier: 0.5}, 3, time.Second},
		{"NaN multiplier is constant", backoff.Config{Base: time.Second, Max: time.Hour, Multiplier: math.NaN()}, 3, time.Second},
		{"zero base", backoff.Config{Max: time.Hour, Multiplier: 2}, 10, 0},
		{"base equals max", backoff.Config{Base: time.Minute, Max: time.Minute, Multiplier: 2}, 0, time.Minute},
		{"base above max is capped", backoff.Config{Base: time.Hour, Max: time.Minute, Multiplier: 2}, 0, time.Minute},
		{"zero config", backoff.Config{}, 3, 0},
		{"negative base", backoff.Config{Base: -time.Second, Max: time.Minute, Multiplier: 2}, 3, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, tt.cfg.BaseDelay(tt.retry))
		})
	}
}

func TestDelayAtJitterBounds(t *testing.T) {
	t.Parallel()
	exp := func(j backoff.Jitter) backoff.Config {
		return backoff.Config{Base: 10 * time.Second, Max: time.Minute, Multiplier: 2, Jitter: j, JitterMax: 3 * time.Second}
	}
	tests := []struct {
		name       string
		cfg        backoff.Config
		retry      int
		r          backoff.Rand
		wantDelay  time.Duration
		wantJitter time.Duration
	}{
		{"none", exp(backoff.JitterNone), 1, fixedRand(-1), 20 * time.Second, 0},
		{"empty mode is none", exp(""), 1, fixedRand(-1), 20 * time.Second, 0},
		{"full low", exp(backoff.JitterFull), 1, fixedRand(0), 0, -20 * time.Second},
		{"full high", exp(backoff.JitterFull), 1, fixedRand(-1), 20 * time.Second, 0},
		{"full middle", exp(backoff.JitterFull), 1, fixedRand(int64(5 * time.Second)), 5 * time.Second, -15 * time.Second},
		{"equal low", exp(backoff.JitterEqual), 1, fixedRand(0), 10 * time.Second, -10 * time.Second},
		{"equal high", exp(backoff.JitterEqual), 1, fixedRand(-1), 20 * time.Second, 0},
		{"additive low", exp(backoff.JitterAdditive), 1, fixedRand(0), 20 * time.Second, 0},
		{"additive high", exp(backoff.JitterAdditive), 1, fixedRand(-1), 23 * time.Second, 3 * time.Second},
		{"additive above max", exp(backoff.JitterAdditive), 10, fixedRand(-1), 63 * time.Second, 3 * time.Second},
		{"full capped", exp(backoff.JitterFull), 10, fixedRand(-1), time.Minute, 0},
		{"additive zero JitterMax", backoff.Config{Base: time.Second, Max: time.Second, Multiplier: 2, Jitter: backoff.JitterAdditive}, 0, fixedRand(-1), time.Second, 0},
		{"full zero delay", backoff.Config{Max: time.Second, Multiplier: 2, Jitter: backoff.JitterFull}, 4, fixedRand(-1), 0, 0},
		{"full over the whole Duration range", backoff.Config{Base: math.MaxInt64, Max: math.MaxInt64, Multiplier: 2, Jitter: backoff.JitterFull}, 3, fixedRand(-1), math.MaxInt64 - 1, -1},
		{"additive saturates", backoff.Config{Base: math.MaxInt64, Max: math.MaxInt64, Multiplier: 2, Jitter: backoff.JitterAdditive, JitterMax: time.Hour}, 1, fixedRand(-1), math.MaxInt64, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			delay, jitter := tt.cfg.Delay(tt.retry, tt.r)
			require.Equal(t, tt.wantDelay, delay, "delay")
			require.Equal(t, tt.wantJitter, jitter, "jitter")
		})
	}
}

// TestDelaySeeded checks each mode against the formula evaluated with an
// identically seeded source, so the test pins the arithmetic, not a
// snapshot of the generator.
func TestDelaySeeded(t *testing.T) {
	t.Parallel()
	const seed1, seed2 = 3, 4
	tests := []struct {
		name string
		cfg  backoff.Config
		want func(d time.Duration, r *rand.Rand) time.Duration
	}{
		{"seed003 additive", backoff.Default(), func(d time.Duration, r *rand.Rand) time.Duration {
			return d + time.Duration(r.Int64N(int64(time.Second)+1))
		}},
		{"seed004 additive", backoff.JobDefault(), func(d time.Duration, r *rand.Rand) time.Duration {
			return d + time.Duration(r.Int64N(int64(5*time.Minute)+1))
		}},
		{"full", backoff.Config{Base: time.Second, Max: time.Minute, Multiplier: 3, Jitter: backoff.JitterFull}, func(d time.Duration, r *rand.Rand) time.Duration {
			return time.Duration(r.Int64N(int64(d) + 1))
		}},
		{"equal", backoff.Config{Base: time.Second, Max: time.Minute, Multiplier: 3, Jitter: backoff.JitterEqual}, func(d time.Duration, r *rand.Rand) time.Duration {
			return d - d/2 + time.Duration(r.Int64N(int64(d/2)+1))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := rand.New(rand.NewPCG(seed1, seed2))
			ref := rand.New(rand.NewPCG(seed1, seed2))
			for retry := range 12 {
				d := tt.cfg.BaseDelay(retry)
				delay, jitter := tt.cfg.Delay(retry, got)
				require.Equal(t, tt.want(d, ref), delay, "retry %d", retry)
				require.Equal(t, d+jitter, delay, "retry %d", retry)
			}
		})
	}
}

func TestDelayDeterministic(t *testing.T) {
	t.Parallel()
	schedule := func(seed uint64) []time.Duration {
		r := rand.New(rand.NewPCG(seed, 0))
		var out []time.Duration
		for retry := range 8 {
			d, _ := backoff.Default().Delay(retry, r)
			out = append(out, d)
		}
		return out
	}
	require.Equal(t, schedule(1), schedule(1))
	require.NotEqual(t, schedule(1), schedule(2))
}

func TestNilRandUsesDefaultSource(t *testing.T) {
	t.Parallel()
	cfg := backoff.Config{Base: time.Second, Max: time.Minute, Multiplier: 2, Jitter: backoff.JitterFull}
	seen := map[time.Duration]bool{}
	for range 50 {
		d, _ := cfg.Delay(5, nil)
		require.GreaterOrEqual(t, d, time.Duration(0))
		require.LessOrEqual(t, d, 32*time.Second)
		seen[d] = true
	}
	// 50 draws from 32e9+1 values: a repeat-only result means no randomness.
	require.Greater(t, len(seen), 1)
}

func TestNextAttemptAt(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	cfg := backoff.JobDefault()
	require.Equal(t, now.Add(8*time.Hour+5*time.Minute), cfg.NextAttemptAt(now, 2, fixedRand(-1)))
	require.Equal(t, now.Add(8*time.Hour), cfg.NextAttemptAt(now, 2, fixedRand(0)))
}

// TestDelayProperties draws random configs and retries from a seeded source
// and checks the invariants every schedule keeps.
func TestDelayProperties(t *testing.T) {
	t.Parallel()
	gen := rand.New(rand.NewPCG(2024, 83))
	modes := []backoff.Jitter{backoff.JitterNone, backoff.JitterFull, backoff.JitterEqual, backoff.JitterAdditive}
	for i := range 5000 {
		base := time.Duration(gen.Int64N(int64(48 * time.Hour)))
		cfg := backoff.Config{
			Base:       base,
			Max:        base + time.Duration(gen.Int64N(int64(72*time.Hour))),
			Multiplier: 1 + gen.Float64()*4,
			Jitter:     modes[gen.IntN(len(modes))],
			JitterMax:  time.Duration(gen.Int64N(int64(10 * time.Minute))),
		}
		require.NoError(t, cfg.Validate())
		retry := gen.IntN(80)
		if i%10 == 0 {
			retry = math.MaxInt - gen.IntN(1000)
		}
		d := cfg.BaseDelay(retry)
		lo, hi := cfg.Bounds(retry)
		delay, jitter := cfg.Delay(retry, gen)

		require.GreaterOrEqual(t, d, cfg.Base, "%+v retry %d", cfg, retry)
		require.LessOrEqual(t, d, cfg.Max, "%+v retry %d", cfg, retry)
		require.LessOrEqual(t, d, cfg.BaseDelay(retry+1), "BaseDelay must not decrease: %+v retry %d", cfg, retry)
		require.GreaterOrEqual(t, delay, lo, "%+v retry %d", cfg, retry)
		require.LessOrEqual(t, delay, hi, "%+v retry %d", cfg, retry)
		require.GreaterOrEqual(t, lo, time.Duration(0))
		require.Equal(t, d+jitter, delay)
		if cfg.Jitter == backoff.JitterAdditive {
			require.LessOrEqual(t, delay, cfg.Max+cfg.JitterMax)
			require.GreaterOrEqual(t, jitter, time.Duration(0))
		} else {
			require.LessOrEqual(t, delay, cfg.Max)
			require.LessOrEqual(t, jitter, time.Duration(0))
		}
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	ok := backoff.Default()
	tests := []struct {
		name    string
		mutate  func(*backoff.Config)
		wantErr string
	}{
		{"default", func(*backoff.Config) {}, ""},
		{"zero base and max", func(c *backoff.Config) { c.Base, c.Max = 0, 0 }, ""},
		{"empty jitter", func(c *backoff.Config) { c.Jitter = "" }, ""},
		{"negative base", func(c *backoff.Config) { c.Base = -1 }, "Config.Base"},
		{"max below base", func(c *backoff.Config) { c.Max = time.Millisecond }, "Config.Max"},
		{"multiplier below 1", func(c *backoff.Config) { c.Multiplier = 0.9 }, "Config.Multiplier"},
		{"multiplier zero", func(c *backoff.Config) { c.Multiplier = 0 }, "Config.Multiplier"},
		{"multiplier NaN", func(c *backoff.Config) { c.Multiplier = math.NaN() }, "Config.Multiplier"},
		{"multiplier Inf", func(c *backoff.Config) { c.Multiplier = math.Inf(1) }, "Config.Multiplier"},
		{"unknown jitter", func(c *backoff.Config) { c.Jitter = "decorrelated" }, "Config.Jitter"},
		{"negative jitter max", func(c *backoff.Config) { c.JitterMax = -time.Second }, "Config.JitterMax"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := ok
			tt.mutate(&cfg)
			err := cfg.Validate()
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, backoff.ErrInvalid)
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}

func BenchmarkDelay(b *testing.B) {
	cfg := backoff.JobDefault()
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; b.Loop(); i++ {
		cfg.Delay(i%40, r)
	}
}
