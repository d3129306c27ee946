// Package chat runs a dashboard's chat turns: one message to a new or an existing Hermes
// session, answered by the real agent on the org's home exactly as a job runs it (the
// same config.yaml contract, the same command line, the same minimal environment), while
// the turn holds the session: and home: leases through the control API (DESIGN section 4,
// "One agent per home"). A turn belongs to the Runner, not to the HTTP request that
// started it: closing the tab does not stop it, and a page reloaded later finds it again.
package chat

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"

	"hermeshost/control"
	"hermeshost/hermescli"
	"hermeshost/internal/tail"
	"hermeshost/orghome"
	"hermeshost/service"
	"hermeshost/worker"
)

// States of a turn.
const (
	StateQueued  = "queued"
	StateRunning = "running"
	StateDone    = "done"
	StateStopped = "stopped"
	StateFailed  = "failed"
)

// DefaultLeaseTTL is the lifetime of a turn's leases, refreshed every third of it, as the
// dispatcher keeps its own (dispatch.DefaultLeaseTTL).
const DefaultLeaseTTL = 15 * time.Second

// acquireWait is how long one acquire waits in the control API for a key to come free
// before the turn looks again (and notices a Stop).
const acquireWait = 2 * time.Second

// MaxMessage bounds a chat message, which goes on the agent's command line.
const MaxMessage = 32 << 10

// keptTurns is how many ended turns a Runner remembers for their pages; older ones are
// forgotten (their sessions stay in state.db).
const keptTurns = 500

// ErrQueueFull refuses a second queued turn for one session.
var ErrQueueFull = errors.New("a message to this session is already queued")

// sessionPattern is a Hermes session id as the CLI prints it (hermescli's session line).
var sessionPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// Config is what a Runner needs of its org; the agent's values are the worker's (see
// worker.Config), so a chat turn meets the home as a job does.
type Config struct {
	Org           string
	Home          *orghome.Home
	Control       *control.Client
	HermesBin     string
	MaxTurns      int
	GatewayURL    string // the gateway's base URL; config.yaml names <url>/v1
	GatewayKey    service.Secret
	Model         string
	EgressURL     string // the unit's egress proxy on its loopback, the agent's HTTPS_PROXY; empty: none
	BundledSkills string
	// Bundled is the image's bundled skills and SkillsMax the authored skills kept enabled
	// (SKILLS_MAX_AUTHORED, 0: no cap): the cap is applied before a turn as before a job.
	Bundled   *orghome.Bundled
	SkillsMax int
	Plugin    orghome.Plugin
	LeaseTTL  time.Duration // DefaultLeaseTTL when zero
	Log       *slog.Logger
	// Sweep, when set, ends whatever a turn's agent left running: the agent runs as the
	// dashboard's own uid in its unit, and what it detached (setsid, double fork) leaves
	// the process group its stop kills. It is called once the agent has exited, before the
	// turn gives up the home: lease. An error says something may still run there: the
	// turn fails, its home: lease is left to expire rather than released (no agent may
	// start on the home beside what is left), and Broken is called, which must end the
	// unit (the dashboard exits; its unit's end takes the rest).
	Sweep  func() error
	Broken func(error)
}

// Turn is a snapshot of one turn.
type Turn struct {
	ID        string
	Operator  string
	Message   string
	SessionID string // empty until the agent printed it, for a new session
	Resume    bool   // the turn continues an existing session
	State     string
	Position  int    // 1-based place in the queue while queued
	HeldBy    string // while queued: who holds the lease the turn waits for
	Waiting   string // the lease key it waits for
	Answer    string // the agent's final answer, once done
	Reason    string // why it failed or was stopped
	StartedAt time.Time
	RunningAt time.Time // when it took its leases and started the agent
	AgentAt   time.Time // when the agent's process started
	EndedAt   time.Time
	// prior is, for a new session, the home's newest session before the agent started:
	// the turn's own is a newer one.
	prior string
	// Rev counts the turn's changes: its state, and while it runs each write the agent
	// makes to state.db. A page that showed Rev n waits for n+1 (WaitChange).
	Rev uint64
}

// Active says whether the turn is still queued or running.
func (t Turn) Active() bool { return t.State == StateQueued || t.State == StateRunning }

type turn struct {
	Turn
	ctx    context.Context
	cancel context.CancelCauseFunc
	done   chan struct{}
}

// Runner runs one org's chat turns, one at a time (the home: lease allows no more), in
// the order they were sent.
type Runner struct {
	cfg    Config
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	turns map[string]*turn
	queue []*turn  // waiting and the one at its head, which may be acquiring or running
	ended []string // ids of ended turns, oldest first
	wake  chan struct{}
	// changed is closed, and replaced, whenever a turn changes: Wait's signal.
	changed chan struct{}
}

// NewRunner starts the Runner's loop; Close ends it.
func NewRunner(cfg Config) (*Runner, error) {
	switch {
	case (cfg.Sweep == nil) != (cfg.Broken == nil):
		return nil, errors.New("chat: Sweep and Broken go together")
	case cfg.Home == nil || cfg.Home.ID != cfg.Org:
		return nil, errors.New("chat: no home of the org")
	case cfg.Control == nil:
		return nil, errors.New("chat: no control API client")
	case cfg.HermesBin == "":
		return nil, errors.New("chat: no agent command (HERMES_BIN)")
	case cfg.MaxTurns < 1:
		return nil, errors.New("chat: MAX_TURNS must be at least 1")
	case cfg.GatewayURL == "" || cfg.Model == "":
		return nil, errors.New("chat: no gateway URL or model")
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Runner{cfg: cfg, ctx: ctx, cancel: cancel, turns: map[string]*turn{}, wake: make(chan struct{}, 1), changed: make(chan struct{})}
	r.wg.Add(1)
	go r.loop()
	return r, nil
}

// Close stops every turn (killing a running agent, releasing its leases) and waits.
func (r *Runner) Close() {
	r.cancel()
	r.wg.Wait()
}

// Start queues a turn: message to session (an existing session id), or to a new session
// when session is "". A second queued turn for one session is ErrQueueFull.
func (r *Runner) Start(operator, session, message string) (Turn, error) {
	message = strings.TrimSpace(message)
	switch {
	case message == "":
		return Turn{}, errors.New("the message is empty")
	case len(message) > MaxMessage:
		return Turn{}, fmt.Errorf("the message is %d bytes; at most %d are sent", len(message), MaxMessage)
	case session != "" && !sessionPattern.MatchString(session):
		return Turn{}, fmt.Errorf("%q is not a Hermes session id", session)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ctx.Err() != nil {
		return Turn{}, errors.New("the dashboard is shutting down")
	}
	if session != "" {
		for _, q := range r.queue {
			if q.SessionID == session && q.State == StateQueued {
				return Turn{}, fmt.Errorf("%w (turn %s, position %d): one message a session waits at a time; send this one when it has run", ErrQueueFull, q.ID, r.positionLocked(q))
			}
		}
	}
	ctx, cancel := context.WithCancelCause(r.ctx)
	t := &turn{Turn: Turn{
		ID: newID(), Operator: operator, Message: message, SessionID: session, Resume: session != "",
		State: StateQueued, StartedAt: time.Now(), Rev: 1,
	}, ctx: ctx, cancel: cancel, done: make(chan struct{})}
	r.turns[t.ID] = t
	r.queue = append(r.queue, t)
	r.changedLocked()
	r.poke()
	return r.snapshotLocked(t), nil
}

// Get is the turn with that id, if this Runner has it.
func (r *Runner) Get(id string) (Turn, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.turns[id]
	if !ok {
		return Turn{}, false
	}
	return r.snapshotLocked(t), true
}

// Current is the session's turn that is queued or running, if any (the running one first).
func (r *Runner) Current(session string) (Turn, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, t := range r.queue {
		if t.SessionID == session && t.Active() {
			return r.snapshotLocked(t), true
		}
	}
	return Turn{}, false
}

// Stop ends a turn: a queued one leaves the queue, a running one's agent is killed and its
// leases released. It returns once the turn has ended; an ended turn is left as it was.
func (r *Runner) Stop(id, operator string) (Turn, bool) {
	r.mu.Lock()
	t, ok := r.turns[id]
	if !ok {
		r.mu.Unlock()
		return Turn{}, false
	}
	if t.Active() {
		t.cancel(fmt.Errorf("stopped by %s", operator))
	}
	head := len(r.queue) > 0 && r.queue[0] == t
	if !head && t.State == StateQueued {
		r.endLocked(t, StateStopped, fmt.Sprintf("stopped by %s before it ran", operator))
	}
	r.mu.Unlock()
	<-t.done
	return r.Get(id)
}

// Done is closed when the turn has ended (for tests and callers that wait).
func (r *Runner) Done(id string) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t, ok := r.turns[id]; ok {
		return t.done
	}
	return nil
}

// Wait returns the turn once cond holds for it, or ctx's error; false when there is no
// such turn.
func (r *Runner) Wait(ctx context.Context, id string, cond func(Turn) bool) (Turn, bool, error) {
	for {
		r.mu.Lock()
		t, ok := r.turns[id]
		if !ok {
			r.mu.Unlock()
			return Turn{}, false, nil
		}
		s, ch := r.snapshotLocked(t), r.changed
		r.mu.Unlock()
		if cond(s) {
			return s, true, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return s, true, ctx.Err()
		}
	}
}

// changedLocked wakes Wait's callers.
func (r *Runner) changedLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *Runner) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *Runner) positionLocked(t *turn) int {
	for i, q := range r.queue {
		if q == t {
			return i + 1
		}
	}
	return 0
}

func (r *Runner) snapshotLocked(t *turn) Turn {
	s := t.Turn
	if s.State == StateQueued {
		s.Position = r.positionLocked(t)
	}
	return s
}

// endLocked records how t ended and takes it off the queue.
func (r *Runner) endLocked(t *turn, state, reason string) {
	if !t.Active() {
		return
	}
	t.State, t.Reason, t.EndedAt = state, reason, time.Now()
	t.Rev++
	for i, q := range r.queue {
		if q == t {
			r.queue = append(r.queue[:i], r.queue[i+1:]...)
			break
		}
	}
	close(t.done)
	r.ended = append(r.ended, t.ID)
	if len(r.ended) > keptTurns {
		delete(r.turns, r.ended[0])
		r.ended = r.ended[1:]
	}
	r.changedLocked()
}

func (r *Runner) update(t *turn, f func(*Turn)) {
	r.mu.Lock()
	f(&t.Turn)
	t.Rev++
	r.changedLocked()
	r.mu.Unlock()
}

// WaitChange returns the turn once its Rev is past rev (or it has ended: an ended turn
// changes no more), or ctx's error; false when there is no such turn.
func (r *Runner) WaitChange(ctx context.Context, id string, rev uint64) (Turn, bool, error) {
	return r.Wait(ctx, id, func(t Turn) bool { return t.Rev > rev || !t.Active() })
}

// loop runs the queue's head, one turn at a time, until Close.
func (r *Runner) loop() {
	defer r.wg.Done()
	for {
		r.mu.Lock()
		var next *turn
		if len(r.queue) > 0 {
			next = r.queue[0]
		}
		r.mu.Unlock()
		if r.ctx.Err() != nil {
			r.mu.Lock()
			for len(r.queue) > 0 {
				r.endLocked(r.queue[0], StateStopped, "the dashboard shut down before the turn ran")
			}
			r.mu.Unlock()
			return
		}
		if next == nil {
			select {
			case <-r.wake:
			case <-r.ctx.Done():
			}
			continue
		}
		state, reason, answer, session := r.run(next)
		r.mu.Lock()
		if answer != "" {
			next.Answer = answer
		}
		if session != "" {
			next.SessionID = session
		}
		r.endLocked(next, state, reason)
		r.mu.Unlock()
	}
}

// run takes the turn's leases, waiting while others hold them, runs the agent and
// releases them. Its results are the turn's end.
func (r *Runner) run(t *turn) (state, reason, answer, session string) {
	ctx := t.ctx
	stopped := func() (string, string, string, string) {
		if r.ctx.Err() != nil && context.Cause(ctx) == context.Canceled {
			return StateStopped, "the dashboard shut down", "", ""
		}
		return StateStopped, context.Cause(ctx).Error(), "", ""
	}
	holder := "chat:" + r.cfg.Org + ":" + t.ID
	sessionKey := "session:new-" + t.ID // a new session has no id yet: a key of its own
	if t.Resume {
		sessionKey = "session:" + t.SessionID
	}
	sessionLease, err := r.acquire(ctx, t, sessionKey, holder)
	if err != nil {
		if ctx.Err() != nil {
			return stopped()
		}
		return StateFailed, err.Error(), "", ""
	}
	defer func() { r.release(sessionLease) }()
	// The session's lease is kept while the turn waits for the home, which a job may hold
	// for as long as it runs: a lease left to expire meanwhile would be lost.
	held := []control.Lease{sessionLease}
	waitCtx, stopWaiting := context.WithCancelCause(ctx)
	waited := r.keep(waitCtx, stopWaiting, held...)
	homeLease, err := r.acquire(waitCtx, t, "home:"+r.cfg.Org, holder)
	lost := context.Cause(waitCtx)
	stopWaiting(nil)
	<-waited
	sessionLease = held[0]
	if err != nil {
		if errors.Is(lost, errLeaseLost) {
			return StateFailed, lost.Error(), "", ""
		}
		if ctx.Err() != nil {
			return stopped()
		}
		return StateFailed, err.Error(), "", ""
	}
	leftBehind := false // the sweep failed: the home: lease is left to expire
	defer func() {
		if !leftBehind {
			r.release(homeLease)
		}
	}()

	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	kept := r.keep(runCtx, cancel, sessionLease, homeLease)
	defer func() { cancel(nil); <-kept }()
	prior := ""
	if !t.Resume {
		prior = r.newestSession(ctx)
	}
	// Truncated to the second: slack for clocks that round, never missing the new session.
	r.update(t, func(s *Turn) {
		s.HeldBy, s.Waiting, s.RunningAt, s.prior = "", "", time.Now().Truncate(time.Second), prior
	})

	watchCtx, unwatch := context.WithCancel(runCtx)
	watched := r.watchState(watchCtx, t)
	res, code, err := r.exec(runCtx, t)
	unwatch()
	<-watched
	if r.cfg.Sweep != nil {
		if serr := r.cfg.Sweep(); serr != nil {
			leftBehind = true
			r.cfg.Log.Error("chat: what the turn's agent left running could not be ended; the dashboard stops", "turn", t.ID, "err", serr)
			r.cfg.Broken(serr)
			return StateFailed, "what the agent left running could not be ended (" + serr.Error() + "): the dashboard stops", "", res.SessionID
		}
	}
	if runCtx.Err() != nil {
		if errors.Is(context.Cause(runCtx), errLeaseLost) {
			return StateFailed, context.Cause(runCtx).Error(), "", res.SessionID
		}
		st, why, _, _ := stopped()
		return st, why, "", res.SessionID
	}
	switch {
	case err != nil:
		return StateFailed, err.Error(), "", res.SessionID
	case code != 0:
		why := fmt.Sprintf("the agent exited with status %d", code)
		if last := lastLine(res.Stderr); last != "" {
			why += ": " + last
		}
		return StateFailed, why, "", res.SessionID
	}
	return StateDone, "", answerOf(res.Stdout), res.SessionID
}

// acquire waits for key, recording who holds it meanwhile, and takes it; the home's file
// lock is tried once the home: lease is ours, and a busy one is waited out the same way.
func (r *Runner) acquire(ctx context.Context, t *turn, key, holder string) (control.Lease, error) {
	// The first try does not wait, so the page can say at once who holds the key.
	for wait := time.Duration(0); ; wait = acquireWait {
		l, err := r.cfg.Control.Acquire(ctx, key, holder, r.cfg.LeaseTTL, wait)
		if err == nil {
			return l, nil
		}
		if ctx.Err() != nil {
			return control.Lease{}, ctx.Err()
		}
		if !control.IsHeld(err) {
			return control.Lease{}, fmt.Errorf("take lease %s: %w", key, err)
		}
		by := ""
		var apiErr *control.APIError
		if errors.As(err, &apiErr) && apiErr.HeldBy != nil {
			by = apiErr.HeldBy.Holder
		}
		r.update(t, func(s *Turn) { s.HeldBy, s.Waiting = by, key })
	}
}

func (r *Runner) release(l control.Lease) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.cfg.Control.Release(ctx, l); err != nil {
		r.cfg.Log.Warn("chat: release lease", "key", l.Key, "err", err)
	}
}

var errLeaseLost = errors.New("the turn lost its lease")

// keep refreshes the leases every third of their TTL; a lost one cancels the run, which
// kills the agent at once.
func (r *Runner) keep(ctx context.Context, cancel context.CancelCauseFunc, ls ...control.Lease) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(r.cfg.LeaseTTL / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			for i, l := range ls {
				nl, err := r.cfg.Control.Refresh(ctx, l, r.cfg.LeaseTTL)
				switch {
				case control.IsLost(err):
					cancel(fmt.Errorf("%w %s: %v", errLeaseLost, l.Key, err))
					return
				case err != nil && ctx.Err() == nil:
					r.cfg.Log.Warn("chat: refresh lease", "key", l.Key, "err", err)
				case err == nil:
					ls[i] = nl
				}
			}
		}
	}()
	return done
}

// exec runs the agent as the worker does (worker.runner.exec): config.yaml made right
// first, its own process group killed on stop, and in its environment only its home and
// the org's gateway key under the name config.yaml gives it. A chat has no job: no token
// proxy, no sartiq, no hook socket. Its working folder is a fresh one with no manifest.
func (r *Runner) exec(ctx context.Context, t *turn) (result, int, error) {
	lock, err := worker.LockHome(r.cfg.Home.Dir)
	if err != nil {
		return result{}, 0, fmt.Errorf("%w: another agent is running on this home", err)
	}
	defer lock.Unlock() //nolint:errcheck // the kernel drops it with the process anyway
	// As before a job's agent: the block the last agent may have edited, put right.
	if _, err := r.cfg.Home.EnsureSoul(orghome.Identity{OrgID: r.cfg.Org, DisplayName: r.cfg.Org}); err != nil {
		return result{}, 0, fmt.Errorf("ensure SOUL.md: %w", err)
	}
	if _, err := r.cfg.Home.EnsureAgentSetup(hermescli.Setup(r.cfg.GatewayURL, r.cfg.Model, r.cfg.BundledSkills, r.cfg.Plugin)); err != nil {
		return result{}, 0, err
	}
	if r.cfg.SkillsMax > 0 {
		// The cap as a job applies it; usage unknown (state.db busy) leaves it to the next start.
		if _, err := r.cfg.Home.EnforceSkillCap(ctx, r.cfg.SkillsMax, r.cfg.Bundled); err != nil && !errors.Is(err, orghome.ErrStateBusy) {
			return result{}, 0, err
		}
	}
	dir, err := os.MkdirTemp("", "hermes-chat-")
	if err != nil {
		return result{}, 0, fmt.Errorf("chat working folder: %w", err)
	}
	defer os.RemoveAll(dir)
	resume := ""
	if t.Resume {
		resume = t.SessionID
	}
	tail := tail.New(4 << 10)
	res, code, err := hermescli.Launch{
		Bin: r.cfg.HermesBin, Args: hermescli.Args(t.Message, r.cfg.MaxTurns, resume), Home: r.cfg.Home.Dir,
		GatewayKey: r.cfg.GatewayKey.Reveal(), Dir: dir, Env: hermescli.ProxyEnv(r.cfg.EgressURL), Stderr: io.MultiWriter(os.Stderr, tail),
	}.Run(ctx, func() { r.update(t, func(s *Turn) { s.State, s.AgentAt = StateRunning, time.Now() }) })
	return result{res, tail.String()}, code, err
}

// watchState moves the turn's Rev on whenever the agent writes to the home's state.db
// (its -wal, where a WAL-mode write lands, or the file itself), so the turn's pages show
// each row as it is written. One watch per running turn, however many tabs show it;
// should the kernel refuse a watch, the turn moves on every second instead (logged).
func (r *Runner) watchState(ctx context.Context, t *turn) <-chan struct{} {
	done := make(chan struct{})
	w, err := fsnotify.NewWatcher()
	if err == nil {
		if err = w.Add(r.cfg.Home.Dir); err != nil {
			w.Close()
		}
	}
	if err != nil {
		r.cfg.Log.Warn("chat: cannot watch state.db; the turn's page refreshes every second", "org", r.cfg.Org, "err", err)
		go func() {
			defer close(done)
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
					r.update(t, func(*Turn) {})
				}
			}
		}()
		return done
	}
	go func() {
		defer close(done)
		defer w.Close()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				if name := filepath.Base(ev.Name); (name == orghome.StateFile || name == orghome.StateFile+"-wal") && ev.Has(fsnotify.Write) {
					r.update(t, func(*Turn) {})
				}
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				r.cfg.Log.Warn("chat: watching state.db", "org", r.cfg.Org, "err", err)
			}
		}
	}()
	return done
}

// result is what a run said: hermescli's reading, and the end of its stderr, which says
// why a failed run failed.
type result struct {
	hermescli.Result
	Stderr string
}

// lastLine is the last line of s with text, cut to 500 bytes.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	last := strings.TrimSpace(lines[len(lines)-1])
	if len(last) > 500 {
		last = last[:500]
	}
	return strings.ToValidUTF8(last, "")
}

// answerOf is the final answer of quiet mode: stdout without the warning lines the real
// CLI prints before it (⚠ ...) and the turn-limit line.
func answerOf(stdout []byte) string {
	var keep []string
	for _, line := range strings.Split(string(stdout), "\n") {
		t := strings.TrimSpace(line)
		if strings.HasPrefix(t, "⚠") || strings.Contains(t, hermescli.TurnLimitLine) {
			continue
		}
		keep = append(keep, line)
	}
	return strings.TrimSpace(strings.Join(keep, "\n"))
}

// LiveSession is the session a turn writes to: its own id, or for a new session that has
// not printed its id yet (the CLI prints it at the end), the home's newest session when it
// is newer than the newest before the agent started (and started since the turn began
// running). The home: lease and the home's file lock let no other agent start one
// meanwhile, so that session is this turn's.
func (r *Runner) LiveSession(ctx context.Context, t Turn) (string, error) {
	if t.SessionID != "" || t.State != StateRunning {
		return t.SessionID, nil
	}
	st, err := r.cfg.Home.State()
	if err != nil {
		return "", err
	}
	page, err := st.Sessions(ctx, orghome.SessionQuery{Limit: 1})
	if err != nil {
		return "", err
	}
	if len(page.Sessions) == 1 && page.Sessions[0].ID != t.prior && !page.Sessions[0].StartedAt.Before(t.RunningAt) {
		return page.Sessions[0].ID, nil
	}
	return "", nil
}

// newestSession is the home's newest session id ("" for none, or when state.db cannot say:
// the turn's start time alone then tells its session).
func (r *Runner) newestSession(ctx context.Context) string {
	st, err := r.cfg.Home.State()
	if err != nil {
		return ""
	}
	page, err := st.Sessions(ctx, orghome.SessionQuery{Limit: 1})
	if err != nil || len(page.Sessions) == 0 {
		return ""
	}
	return page.Sessions[0].ID
}

func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
