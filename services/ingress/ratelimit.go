package ingress

import (
	"container/list"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/retryd/retryd/internal/serve"
)

// CodeRateLimited is the error code of an intake request refused because
// its caller sent more than Config.IntakeRate allows (429).
const CodeRateLimited = "rate_limited"

// DefaultMaxIntakeCallers is how many callers' limiters are kept; the
// least recently seen is forgotten beyond it.
const DefaultMaxIntakeCallers = 10_000

// callerLimiter gives each caller (principal name) its own token bucket,
// so one producer's flood cannot take the intake capacity of the others.
// Memory is bounded: at most max buckets, the least recently used dropped
// first. A dropped caller starts again with a full bucket, which is at most
// one burst more than its rate; reaching that needs max other live tokens.
type callerLimiter struct {
	limit rate.Limit
	burst int
	max   int

	mu      sync.Mutex
	byName  map[string]*list.Element // of *callerEntry
	recency *list.List               // front: most recently used
}

type callerEntry struct {
	name string
	lim  *rate.Limiter
}

func newCallerLimiter(perSecond float64, burst, max int) *callerLimiter {
	return &callerLimiter{limit: rate.Limit(perSecond), burst: burst, max: max,
		byName: map[string]*list.Element{}, recency: list.New()}
}

// allow takes one request from name's bucket at now. When the bucket is
// empty it returns false and how long until a request would be allowed.
func (l *callerLimiter) allow(name string, now time.Time) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var lim *rate.Limiter
	if el, ok := l.byName[name]; ok {
		l.recency.MoveToFront(el)
		lim = el.Value.(*callerEntry).lim
	} else {
		if l.recency.Len() >= l.max {
			oldest := l.recency.Back()
			l.recency.Remove(oldest)
			delete(l.byName, oldest.Value.(*callerEntry).name)
		}
		lim = rate.NewLimiter(l.limit, l.burst)
		l.byName[name] = l.recency.PushFront(&callerEntry{name: name, lim: lim})
	}
	if lim.AllowN(now, 1) {
		return true, 0
	}
	// How long until one token is back, without taking it.
	r := lim.ReserveN(now, 1)
	wait := r.DelayFrom(now)
	r.CancelAt(now)
	return false, wait
}

// len is how many callers are tracked (for tests).
func (l *callerLimiter) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.recency.Len()
}

// allowIntake applies Config.IntakeRate to the request's principal; when
// it refuses, it has answered 429 with Retry-After and the caller must
// stop.
func (s *Service) allowIntake(w http.ResponseWriter, r *http.Request) bool {
	if s.limiter == nil {
		return true
	}
	name := serve.Actor(r)
	ok, wait := s.limiter.allow(name, s.cfg.Now())
	if ok {
		return true
	}
	s.metrics.rateLimited.Inc()
	secs := max(1, int(math.Ceil(wait.Seconds())))
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	serve.WriteJSON(w, http.StatusTooManyRequests, serve.ErrorBody{Error: serve.ErrorDetail{
		Code: CodeRateLimited,
		Message: fmt.Sprintf("%q sent more than %g requests a second (burst %d): retry after %d s",
			name, s.cfg.IntakeRate, s.cfg.IntakeBurst, secs),
	}})
	return false
}
