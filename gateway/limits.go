package gateway

import (
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// orgLimits gives each caller its own token bucket and its own concurrency slots, so one
// org at its limit is refused at once and never queues another org's requests.
type orgLimits struct {
	rps         rate.Limit
	burst       int
	concurrency int

	mu   sync.Mutex
	orgs map[string]*orgLimit
}

type orgLimit struct {
	bucket *rate.Limiter
	slots  chan struct{}
}

func newOrgLimits(rps float64, burst, concurrency int) *orgLimits {
	return &orgLimits{rps: rate.Limit(rps), burst: burst, concurrency: concurrency, orgs: map[string]*orgLimit{}}
}

// The map grows only with callers that presented a valid key, which the gateway secret
// bounds to the orgs the dispatcher knows.
func (l *orgLimits) of(caller string) *orgLimit {
	l.mu.Lock()
	defer l.mu.Unlock()
	o, ok := l.orgs[caller]
	if !ok {
		o = &orgLimit{bucket: rate.NewLimiter(l.rps, l.burst), slots: make(chan struct{}, l.concurrency)}
		l.orgs[caller] = o
	}
	return o
}

// refusal says why a request was not admitted and when to try again.
type refusal struct {
	outcome    string // rate_limited or busy
	message    string
	retryAfter time.Duration
}

// admit takes one of caller's slots and one token from its bucket, or neither. The
// returned release gives the slot back.
func (l *orgLimits) admit(caller string, now time.Time) (release func(), refused *refusal) {
	o := l.of(caller)
	select {
	case o.slots <- struct{}{}:
	default:
		return nil, &refusal{outcome: outcomeBusy, retryAfter: time.Second,
			message: "too many requests in flight for this key; retry when one has finished"}
	}
	res := o.bucket.ReserveN(now, 1)
	if d := res.DelayFrom(now); !res.OK() || d > 0 {
		res.CancelAt(now)
		<-o.slots
		if !res.OK() || d == rate.InfDuration {
			d = time.Minute
		}
		return nil, &refusal{outcome: outcomeRateLimited, retryAfter: d,
			message: "request rate limit reached for this key"}
	}
	return func() { <-o.slots }, nil
}

// retryAfterSeconds is d as the whole seconds a Retry-After header carries, at least 1.
func retryAfterSeconds(d time.Duration) int {
	return max(1, int(math.Ceil(d.Seconds())))
}
