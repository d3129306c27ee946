package web

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"hermeshost/control"
	"hermeshost/handlers"
	"hermeshost/service"
	"hermeshost/templates"
)

// Tuning of the live stream, copied by each feed when it is made (tests change some before
// they make a dashboard).
var (
	// liveWait is the long-poll's wait_ms, under control.DefaultMaxWait (which a server
	// with a shorter MaxWait refuses: the hub then waits with its default).
	liveWait = 25 * time.Second
	// liveHeartbeat is how often an idle stream gets a comment, so proxies keep it open
	// and a dead client is noticed.
	liveHeartbeat = 15 * time.Second
	// liveRetry is how long after a dropped connection a browser reconnects.
	liveRetry = 2 * time.Second
	// liveWriteTimeout is how long one write to a client may take before it is dropped.
	liveWriteTimeout = 10 * time.Second
	// liveBuffer is how many fragments a subscriber may fall behind before it is dropped
	// (its browser reconnects and replays from the ring).
	liveBuffer = 256
	// liveRing is how many fragments the hub keeps for reconnects.
	liveRing = 2048
	// liveHeadWait is how long a live page's request waits for its feed's loop to catch
	// up when no stream keeps it running (see mark).
	liveHeadWait = 3 * time.Second
)

// liveFeed is one dashboard's live updates (DESIGN section 14): a single loop long-polls the
// control API's job events, however many tabs are open, renders each page of them once
// (handlers.LiveJobs: the jobs and subagents pages) and fans the fragments out to the SSE
// streams subscribed. The loop runs while some stream is open; what it last saw, and a ring
// of recent fragments for browsers that reconnect with Last-Event-ID, outlive it. The
// leases page has a feed of its own, of the org's lease changes (leaseChanges).
type liveFeed struct {
	source                                         liveSource
	render                                         func(context.Context, []control.FeedEvent) []handlers.LiveFragment
	log                                            *slog.Logger
	wait, heartbeat, retry, writeTimeout, headWait time.Duration
	buffer, ringSize                               int

	subscribers prometheus.Gauge
	dropped     prometheus.Counter
	polls       prometheus.Counter

	mu      sync.Mutex
	users   int           // streams open (subscribed or waiting for the head)
	cancel  func()        // stops the running loop; nil when none runs
	done    chan struct{} // closed when the last loop started has returned
	ready   chan struct{} // closed once the running loop knows the head
	known   bool          // last is the head as some loop found it
	last    int64         // the newest event id seen
	floor   int64         // every fragment with an id above floor is in ring
	ring    []liveMessage
	subs    map[*liveSubscriber]struct{}
	backoff time.Duration
}

type liveMessage struct {
	handlers.LiveFragment
	// final is the last fragment of its id: only it carries the id to the browser, so a
	// connection cut within an id's fragments replays all of them.
	final bool
}

type liveSubscriber struct {
	ch chan liveMessage // closed when the hub drops it
}

// liveSource is what a feed follows: pages of events after an id (wait: how long the
// control API may wait for one), a full page holding page events; and, when the source can
// say it, its head, where a first loop starts (without, it pages through the history).
type liveSource struct {
	name string // in the metrics' names: hermes_dashboard_<name>_...
	poll func(ctx context.Context, after int64, wait time.Duration) (control.JobEventFeed, error)
	head func(ctx context.Context) (int64, error)
	page int
}

// jobEvents is the control API's job events of the org: what the jobs and subagents
// pages follow.
func jobEvents(c *control.Client) liveSource {
	return liveSource{name: "live", poll: c.JobEvents, page: control.MaxFeedEvents}
}

// leaseChanges is the control API's lease events of the org, as events of no job (only
// their ids and kinds matter: the leases page is rendered afresh for a change).
func leaseChanges(c *control.Client) liveSource {
	return liveSource{
		name: "lease_live", head: c.LeaseHead, page: control.MaxLeaseChanges,
		poll: func(ctx context.Context, after int64, wait time.Duration) (control.JobEventFeed, error) {
			ch, err := c.LeaseChanges(ctx, after, wait)
			feed := control.JobEventFeed{Last: ch.Last}
			for _, e := range ch.Events {
				feed.Events = append(feed.Events, control.FeedEvent{ID: e.ID, Kind: e.Kind, At: e.At})
			}
			return feed, err
		},
	}
}

func newLiveFeed(src liveSource, render func(context.Context, []control.FeedEvent) []handlers.LiveFragment, log *slog.Logger, reg prometheus.Registerer) *liveFeed {
	f := &liveFeed{
		source: src, render: render, log: log, subs: map[*liveSubscriber]struct{}{}, backoff: time.Second,
		wait: liveWait, heartbeat: liveHeartbeat, retry: liveRetry, writeTimeout: liveWriteTimeout, headWait: liveHeadWait, buffer: liveBuffer, ringSize: liveRing,
		subscribers: prometheus.NewGauge(prometheus.GaugeOpts{Name: "hermes_dashboard_" + src.name + "_subscribers", Help: "SSE streams of the dashboard subscribed to this feed of live updates."}),
		dropped:     prometheus.NewCounter(prometheus.CounterOpts{Name: "hermes_dashboard_" + src.name + "_dropped_total", Help: "SSE streams of this feed dropped for falling behind."}),
		polls:       prometheus.NewCounter(prometheus.CounterOpts{Name: "hermes_dashboard_" + src.name + "_polls_total", Help: "Requests of this feed's live loop to the control API."}),
	}
	done := make(chan struct{})
	close(done)
	f.done = done
	reg.MustRegister(f.subscribers, f.dropped, f.polls)
	return f
}

// mark puts in the request's context the id a page rendered now connects from: the head of
// the events once the feed's loop has caught up. While a stream keeps the loop running that
// is at once; else the request runs the loop, as a stream does, until it has (a first loop
// finds the head; a later one reads what came since it stopped, or skips a long gap). A
// page rendered from further back would be asked to reload as it connected, and an
// operator's click in that moment lost (the first visit to the leases page did that). A
// loop not caught up within liveHeadWait (the control API does not answer) leaves the page
// to follow from whenever its stream connects (-1).
func (f *liveFeed) mark(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r.WithContext(handlers.WithLiveAfter(r.Context(), f.caughtUp(r.Context()))))
	})
}

// caughtUp is the newest event id the loop has seen once it has caught up, or -1 when it
// has not within headWait.
func (f *liveFeed) caughtUp(ctx context.Context) int64 {
	ready := f.join()
	defer f.leave()
	t := time.NewTimer(f.headWait)
	defer t.Stop()
	select {
	case <-ready:
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.last
	case <-ctx.Done():
	case <-t.C:
	}
	return -1
}

// join counts a stream in, starting the loop when it is the first; the channel is closed
// once the loop knows the head.
func (f *liveFeed) join() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.users++
	if f.cancel == nil {
		ctx, cancel := context.WithCancel(context.Background())
		prev, done, ready := f.done, make(chan struct{}), make(chan struct{})
		f.cancel, f.done, f.ready = cancel, done, ready
		go func() {
			defer close(done)
			<-prev // one loop at a time: the last one may still be returning
			f.run(ctx, ready)
		}()
	}
	return f.ready
}

// leave counts a stream out; the last one stops the loop (and its long-poll).
func (f *liveFeed) leave() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.users--
	if f.users == 0 {
		f.cancel()
		f.cancel = nil
	}
}

// attach subscribes a joined stream and returns what it missed after the id its browser
// last saw (has: it said one): the ring's later fragments, or a reload when the ring no
// longer reaches back that far.
func (f *liveFeed) attach(after int64, has bool) (*liveSubscriber, []liveMessage) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := &liveSubscriber{ch: make(chan liveMessage, f.buffer)}
	f.subs[s] = struct{}{}
	f.subscribers.Inc()
	var replay []liveMessage
	switch {
	case !has:
	case after < f.floor:
		replay = []liveMessage{{LiveFragment: handlers.LiveFragment{ID: f.last, Event: templates.LiveReload, HTML: "missed"}, final: true}}
	default:
		for _, m := range f.ring {
			if m.ID > after {
				replay = append(replay, m)
			}
		}
	}
	return s, replay
}

func (f *liveFeed) detach(s *liveSubscriber) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.subs[s]; ok {
		delete(f.subs, s)
		f.subscribers.Dec()
	}
}

// run is the loop: find the head (or what was missed since the last loop), then long-poll.
func (f *liveFeed) run(ctx context.Context, ready chan struct{}) {
	for ctx.Err() == nil {
		if err := f.catchUp(ctx); err != nil {
			f.retryLater(ctx, "find the head of the job events", err)
			continue
		}
		break
	}
	close(ready)
	for ctx.Err() == nil {
		f.mu.Lock()
		after := f.last
		f.mu.Unlock()
		f.polls.Inc()
		feed, err := f.source.poll(ctx, after, f.wait)
		if err != nil {
			f.retryLater(ctx, "long-poll the job events", err)
			continue
		}
		f.publish(ctx, feed)
	}
}

// catchUp brings last to the head. The first loop skips the history before it (nobody was
// watching); a later one renders a short gap (what a page reconnecting asks for), and skips
// a long one, which reconnecting pages then reload for.
func (f *liveFeed) catchUp(ctx context.Context) error {
	f.mu.Lock()
	after, known := f.last, f.known
	f.mu.Unlock()
	skip := !known
	if skip && f.source.head != nil {
		f.polls.Inc()
		head, err := f.source.head(ctx)
		if err != nil {
			return err
		}
		f.mu.Lock()
		f.last, f.floor, f.ring, f.known = head, head, nil, true
		f.mu.Unlock()
		return nil
	}
	for {
		f.polls.Inc()
		feed, err := f.source.poll(ctx, after, 0)
		if err != nil {
			return err
		}
		full := len(feed.Events) >= f.source.page
		if !skip && !full {
			f.publish(ctx, feed)
			f.mu.Lock()
			f.known = true
			f.mu.Unlock()
			return nil
		}
		skip = true
		after = feed.Last
		if !full {
			f.mu.Lock()
			f.last, f.floor, f.ring, f.known = after, after, nil, true
			f.mu.Unlock()
			return nil
		}
	}
}

func (f *liveFeed) retryLater(ctx context.Context, what string, err error) {
	if ctx.Err() != nil {
		return
	}
	f.log.Warn("dashboard: live updates: "+what+"; retrying", "err", err, "in", f.backoff.String())
	t := time.NewTimer(f.backoff)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// publish renders a page of events (outside the lock: it asks the control API), keeps the
// fragments in the ring and hands them to every subscriber without waiting: one whose
// buffer is full is dropped.
func (f *liveFeed) publish(ctx context.Context, feed control.JobEventFeed) {
	var msgs []liveMessage
	if len(feed.Events) > 0 {
		frags := f.render(ctx, feed.Events)
		for i, fr := range frags {
			msgs = append(msgs, liveMessage{LiveFragment: fr, final: i == len(frags)-1 || frags[i+1].ID != fr.ID})
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.last = max(f.last, feed.Last)
	f.ring = append(f.ring, msgs...)
	if over := len(f.ring) - f.ringSize; over > 0 {
		f.floor = max(f.floor, f.ring[over-1].ID)
		f.ring = append([]liveMessage(nil), f.ring[over:]...)
	}
	for s := range f.subs {
		for _, m := range msgs {
			select {
			case s.ch <- m:
				continue
			default:
			}
			delete(f.subs, s)
			close(s.ch)
			f.subscribers.Dec()
			f.dropped.Inc()
			break
		}
	}
}

// ServeHTTP is GET <prefix>/events: the SSE stream. It resumes after Last-Event-ID (a
// browser reconnecting) or ?after= (the id a page was rendered at), sends a comment every
// liveHeartbeat, and ends when the client goes away, falls behind, or stops reading.
func (f *liveFeed) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	after, has := int64(0), false
	for _, v := range []string{r.Header.Get("Last-Event-ID"), r.URL.Query().Get("after")} {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
			after, has = n, true
			break
		}
	}
	stream, ok := openSSE(w, f.retry, f.writeTimeout)
	if !ok {
		return
	}
	write := stream.write
	heartbeat := time.NewTicker(f.heartbeat)
	defer heartbeat.Stop()
	ready := f.join()
	defer f.leave()
	for waiting := true; waiting; {
		select {
		case <-r.Context().Done():
			return
		case <-service.ShuttingDown(r.Context()):
			return
		case <-heartbeat.C:
			if !write(": waiting for the job events\n\n") {
				return
			}
		case <-ready:
			waiting = false
		}
	}
	s, replay := f.attach(after, has)
	defer f.detach(s)
	var b strings.Builder
	for _, m := range replay {
		writeMessage(&b, m)
	}
	// The first bytes after the subscription say the stream is live (and is what a test
	// waits for before it writes an event).
	b.WriteString(": live\n\n")
	if !write(b.String()) {
		return
	}
	for {
		select {
		case <-r.Context().Done():
			return
		case <-service.ShuttingDown(r.Context()):
			return // the browser reconnects to the next dashboard with its last id
		case <-heartbeat.C:
			if !write(": heartbeat\n\n") {
				return
			}
		case m, ok := <-s.ch:
			if !ok {
				return // dropped: the browser reconnects with the last id it got
			}
			b.Reset()
			writeMessage(&b, m)
			// Whatever else is already queued goes in the same write.
			for more := true; more; {
				select {
				case m, ok := <-s.ch:
					if !ok {
						more = false
						break
					}
					writeMessage(&b, m)
				default:
					more = false
				}
			}
			if !write(b.String()) {
				return
			}
		}
	}
}

// writeMessage writes m as an SSE message: its event name, its HTML a data line each
// (the browser joins them with newlines), and the id when it is its id's last fragment.
func writeMessage(b *strings.Builder, m liveMessage) {
	b.WriteString("event: ")
	b.WriteString(m.Event)
	b.WriteByte('\n')
	for _, line := range strings.Split(strings.ReplaceAll(m.HTML, "\r", ""), "\n") {
		b.WriteString("data: ")
		b.WriteString(line)
		b.WriteByte('\n')
	}
	if m.final {
		b.WriteString("id: ")
		b.WriteString(strconv.FormatInt(m.ID, 10))
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
}

// liveRefresh is GET <prefix>/events/refresh, asked by a live page whose stream says it
// missed events (or a job it has not listed appeared): htmx reloads the page.
func liveRefresh(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("HX-Refresh", "true")
	w.WriteHeader(http.StatusNoContent)
}
