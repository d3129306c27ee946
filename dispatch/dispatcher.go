// Package dispatch turns the backend's queue into finished work: it polls behind the gateway
// gate, claims (when CLAIM_ENABLED), runs each organization's jobs one at a time in that
// org's worker through a container runtime, and records claims and the workers' progress in
// the host's job mirror.
//
// Replicas share organizations through org:<id> leases: a dispatcher claims only for orgs
// it owns, and a new owner first makes sure the backend shows no CLAIMED or RUNNING job for
// the org. Every job runs under the org's home:<org> lease as well (one agent per home, a
// chat turn included), fenced by its epoch.
package dispatch

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"hermeshost/dashboards"
	"hermeshost/dispatch/runtime"
	"hermeshost/gateway"
	"hermeshost/lease"
	"hermeshost/mirror"
	"hermeshost/sartiq"
	"hermeshost/service"
	"hermeshost/subagent"
)

// JobTypes are the types polled, one list request each (the API's type defaults to one).
var JobTypes = []string{sartiq.TypeProductIngest, sartiq.TypeGuidelinesExtraction}

// Defaults for Config's zero values.
const (
	DefaultLeaseTTL     = 15 * time.Second
	DefaultMaxOrgs      = 32
	DefaultMaxAttempts  = 3
	DefaultCrashBackoff = 10 * time.Second
	// maxPages bounds one poll's pages per type (100 jobs each).
	maxPages = 50
)

// Config is one dispatcher's settings.
type Config struct {
	Instance string
	Bot      *sartiq.Client
	// APIURL is what workers are told to call (the backend as seen from a worker).
	APIURL  string
	Runtime runtime.Runtime
	DB      *pgxpool.Pool
	// Leases is the lease store on DB; New makes one when nil.
	Leases *lease.Store
	// Subagents is the subagent store on DB, whose handles of a job whose worker is gone
	// are failed; New makes one when nil.
	Subagents *subagent.Store
	// OrgsRoot is the host path of the org homes, for SOUL.md before a worker starts.
	OrgsRoot string

	GatewayURL    string
	GatewayKey    service.Secret // the host's own key, for the gate
	GatewaySecret service.Secret // derives each org's key for its containers
	WorkerModel   string
	VisionModel   string

	// ControlURL is the control API as an org's container reaches it; ControlKey mints the
	// per-org key handed to it with each job. Both empty: workers get no control API.
	ControlURL string
	ControlKey func(org string) (string, error)

	// Dashboards is the store of dashboard requests that RunDashboards serves; nil: none.
	Dashboards *dashboards.Store
	// DashboardSecret derives each org's assertion key (assertion.OrgKey), which its
	// dashboard gets on stdin; the launcher signs with the same secret. Empty: this
	// dispatcher starts no dashboards and leaves the requests to one that can.
	DashboardSecret service.Secret
	// DashboardIdle is how long a dashboard may go unused before it is stopped (30m).
	DashboardIdle time.Duration
	// DashboardCheck is how often RunDashboards looks without a notification (3s).
	DashboardCheck time.Duration
	// KeepDashboards leaves running dashboards for the next start of this instance to
	// adopt when RunDashboards ends (Docker in production); otherwise they are stopped
	// and recorded stopped. Process dashboards are never kept: they die with the host.
	KeepDashboards bool

	ClaimEnabled bool
	// MaxAttempts is how many crashed or failed runs a job may have; past it recovery
	// re-claims the stale job and fails it with the reason.
	MaxAttempts int
	// CrashBackoff spaces the attempts of a job whose runs keep crashing (10s): the first
	// crash is run again at once, the second after CrashBackoff, each later one after three
	// times the wait before (at most 5 minutes), so that a passing trouble (a full disk, a
	// restarting service) does not use up MAX_ATTEMPTS in seconds. The org waits meanwhile.
	CrashBackoff time.Duration
	// LeaseTTL is the lifetime of the org: and home: leases, refreshed every third of it.
	LeaseTTL time.Duration
	// MaxOrgs is how many orgs this dispatcher owns at once.
	MaxOrgs int
	// OrgIdle is how long an owned org may show no work before its lease is given up, so
	// that replicas share orgs (default four LeaseTTLs).
	OrgIdle time.Duration
	// WorkerEnv is passed to every run-job besides what the dispatcher sets (for example
	// HEARTBEAT_INTERVAL, MAX_TURNS, HERMES_BIN).
	WorkerEnv []string
	// DashboardEnv is added to every dashboard's environment: the settings of the agent its
	// chat runs (HERMES_BIN, MAX_TURNS, WORKER_MODEL); never secrets.
	DashboardEnv []string
	Log          *slog.Logger
	HTTP         *http.Client
	Registerer   prometheus.Registerer
}

// Dispatcher runs the cycle. At most one job per org is in flight, and only for orgs whose
// org: lease it holds.
type Dispatcher struct {
	cfg         Config
	leases      *lease.Store
	ownLeases   bool // made by New, closed by Close
	subagents   *subagent.Store
	ownSubs     bool
	mirror      *mirror.Store // writes only: it never starts a listener to close
	holder      string
	metrics     *metrics
	dashMetrics *dashboardMetrics

	mu       sync.Mutex
	owned    map[string]*ownership
	inFlight map[string]*delivery
	backoff  map[string]backoff // orgs whose last worker failed to start
	dash     dashboardsHere
	stopping bool

	// ready are the orgs whose run here just ended, in the order they ended (readySet
	// marks them): Run's ready loop takes each one's next step as soon as one of its
	// stepConcurrency slots is free, instead of at the next tick. wake says one was added
	// (one pending request is enough).
	ready    []string
	readySet map[string]bool
	wake     chan struct{}
	// working are the orgs a step is being taken for: a cycle and the ready loop never
	// work one org at the same time. again are those a ready step found a cycle working:
	// the cycle's snapshot predates the run's end, so the org is kicked again when the
	// cycle's step ends. acquiring counts the org: leases being taken.
	working   map[string]bool
	again     map[string]bool
	acquiring int

	// gateOpenUntil is when the gateway is next asked for its models (gate); gateMu
	// guards it and is held while one step asks for all.
	gateMu        sync.Mutex
	gateOpenUntil time.Time

	// hard ends every delivery at once: the last step of a shutdown.
	hard     context.Context
	hardStop context.CancelFunc
	wg       sync.WaitGroup
}

// backoff keeps an org from being claimed for until; step is the wait that set it.
type backoff struct {
	until time.Time
	step  time.Duration
}

// The first and longest waits after an org's worker failed to start.
const (
	minBackoff = 5 * time.Second
	maxBackoff = 5 * time.Minute
)

// crashBackoff is how long an org waits before the next attempt of a job with crashed
// crashed runs: none after the first, base after the second, three times more after each
// later one, at most maxBackoff.
func crashBackoff(crashed int, base time.Duration) time.Duration {
	wait := time.Duration(0)
	for i := 2; i <= crashed; i++ {
		if wait == 0 {
			wait = base
		} else {
			wait *= 3
		}
		if wait >= maxBackoff {
			return maxBackoff
		}
	}
	return wait
}

// backoffStep is half the next wait of org (the caller holds mu).
func (d *Dispatcher) backoffStep(org string) time.Duration {
	if b, ok := d.backoff[org]; ok {
		return b.step
	}
	return minBackoff / 2
}

type ownership struct {
	lease    lease.Lease
	lastWork time.Time
}

// New is a Dispatcher on cfg.
func New(cfg Config) *Dispatcher {
	if cfg.HTTP == nil {
		cfg.HTTP = &http.Client{Timeout: 10 * time.Second}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.MaxOrgs <= 0 {
		cfg.MaxOrgs = DefaultMaxOrgs
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = DefaultMaxAttempts
	}
	if cfg.CrashBackoff <= 0 {
		cfg.CrashBackoff = DefaultCrashBackoff
	}
	if cfg.OrgIdle <= 0 {
		cfg.OrgIdle = 4 * cfg.LeaseTTL
	}
	if cfg.DashboardIdle <= 0 {
		cfg.DashboardIdle = DefaultDashboardIdle
	}
	if cfg.DashboardCheck <= 0 {
		cfg.DashboardCheck = DefaultDashboardCheck
	}
	leases := cfg.Leases
	if leases == nil {
		leases = lease.New(cfg.DB, lease.Options{Log: cfg.Log})
	}
	subs := cfg.Subagents
	if subs == nil {
		subs = subagent.New(cfg.DB, subagent.Options{Log: cfg.Log})
	}
	hard, hardStop := context.WithCancel(context.Background())
	return &Dispatcher{
		cfg: cfg, leases: leases, ownLeases: cfg.Leases == nil, metrics: newMetrics(cfg.Registerer),
		subagents: subs, ownSubs: cfg.Subagents == nil, dashMetrics: newDashboardMetrics(cfg.Registerer),
		mirror: mirror.New(cfg.DB, mirror.Options{Log: cfg.Log}),
		// One holder name per process: a restarted dispatcher with the same instance name
		// waits out its predecessor's leases instead of taking them as its own.
		holder:   fmt.Sprintf("dispatcher/%s/%d-%s", cfg.Instance, os.Getpid(), rand.Text()[:6]),
		owned:    map[string]*ownership{},
		inFlight: map[string]*delivery{},
		backoff:  map[string]backoff{},
		dash:     newDashboardsHere(),
		readySet: map[string]bool{},
		wake:     make(chan struct{}, 1),
		working:  map[string]bool{},
		again:    map[string]bool{},
		hard:     hard, hardStop: hardStop,
	}
}

// kick asks Run for org's next step now: its run here ended and its slot is free.
func (d *Dispatcher) kick(org string) {
	d.mu.Lock()
	if !d.readySet[org] {
		d.readySet[org] = true
		d.ready = append(d.ready, org)
	}
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// Close releases what New made (its stores' listeners). Call it after Shutdown or Wait.
func (d *Dispatcher) Close() {
	if d.ownLeases {
		d.leases.Close()
	}
	if d.ownSubs {
		d.subagents.Close()
	}
}

// Holder is the name this dispatcher holds its leases under.
func (d *Dispatcher) Holder() string { return d.holder }

// ErrGateClosed: the gateway is down or does not serve both models; nothing was polled.
var ErrGateClosed = errors.New("gateway gate closed")

// gateFresh is how long the gate stays open once the gateway served both models, before
// it is asked again. The ready loop takes a step for every run that ends, up to
// stepConcurrency at once, and asked before each: 4,896 model lists in a 1,383-s scale
// run. A gateway that goes down is noticed within gateFresh; a closed gate is asked again
// at every step.
const gateFresh = time.Second

// gate is nil while the gateway serves both models (asked at most once per gateFresh),
// else ErrGateClosed. Concurrent steps share one request.
func (d *Dispatcher) gate(ctx context.Context) error {
	d.gateMu.Lock()
	defer d.gateMu.Unlock()
	if time.Now().Before(d.gateOpenUntil) {
		return nil
	}
	if err := gateway.Gate(ctx, d.cfg.HTTP, d.cfg.GatewayURL, d.cfg.GatewayKey.Reveal(), d.cfg.WorkerModel, d.cfg.VisionModel); err != nil {
		d.metrics.gateClosed.Inc()
		return fmt.Errorf("%w: %v", ErrGateClosed, err)
	}
	d.gateOpenUntil = time.Now().Add(gateFresh)
	return nil
}

// snapshot is one poll: every QUEUED, CLAIMED and RUNNING job, by org, oldest first of
// every type; orgs are in the order of their oldest job.
type snapshot struct {
	orgs   []string
	queued map[string][]sartiq.Job
	active map[string][]sartiq.Job
	others map[string]bool // orgs another replica owns
}

// Cycle is one poll: the gateway gate first, then one list request per job type (more only
// when a page is full), then for each org with work: ownership, recovery of a stale job, or
// a claim. With claiming off it only logs what it would claim. It returns how many jobs it
// started.
func (d *Dispatcher) Cycle(ctx context.Context) (int, error) {
	if d.isStopping() {
		return 0, nil
	}
	began := time.Now()
	defer func() { d.metrics.cycle.Observe(time.Since(began).Seconds()) }()
	if err := d.gate(ctx); err != nil {
		return 0, err
	}
	snap, err := d.poll(ctx, sartiq.ListJobsParams{Status: sartiq.StatusQueued + "," + sartiq.StatusClaimed + "," + sartiq.StatusRunning})
	if err != nil {
		return 0, err
	}
	if !d.cfg.ClaimEnabled {
		for _, org := range snap.orgs {
			for _, job := range snap.queued[org] {
				d.cfg.Log.Info("CLAIM_ENABLED=false: would claim", "job", job.ID, "type", job.Type, "org", org)
			}
			for _, job := range snap.active[org] {
				if job.Stale {
					d.cfg.Log.Info("CLAIM_ENABLED=false: would re-claim a stale job", "job", job.ID, "org", org)
				}
			}
		}
		return 0, nil
	}
	// One read of who holds which org spares a failed acquire per org another replica owns.
	infos, err := d.leases.List(ctx, "org:")
	if err != nil {
		return 0, fmt.Errorf("read org ownership: %w", err)
	}
	snap.others = map[string]bool{}
	now := time.Now()
	for _, in := range infos {
		if in.Holder != d.holder && in.Held(now.Add(time.Second)) {
			snap.others[strings.TrimPrefix(in.Key, "org:")] = true
		}
	}
	started, err := d.steps(ctx, snap.orgs, snap)
	d.releaseIdle(ctx, snap)
	return started, err
}

// stepConcurrency is how many orgs' steps a cycle, and apart from it the ready loop, takes
// at once. A step is a few round trips to Postgres and the backend; taken one org after
// another, a cycle over 100 orgs under load took 10-20 s, and every org waited for the ones
// before it.
const stepConcurrency = 8

// steps works each of orgs (in order, up to stepConcurrency at once) on snap, and answers
// how many jobs started.
func (d *Dispatcher) steps(ctx context.Context, orgs []string, snap *snapshot) (int, error) {
	var (
		started atomic.Int64
		mu      sync.Mutex
		errs    []error
		wg      sync.WaitGroup
	)
	slots := make(chan struct{}, stepConcurrency)
	for _, org := range orgs {
		if d.isStopping() || ctx.Err() != nil {
			break
		}
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			ok, err := d.work(ctx, org, snap, false)
			if ok {
				started.Add(1)
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return int(started.Load()), errors.Join(errs...)
}

// nextReady takes the org kicked longest ago that is still owned here; an org not owned
// here any more is left to the cycles.
func (d *Dispatcher) nextReady() (string, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for len(d.ready) > 0 {
		org := d.ready[0]
		d.ready = d.ready[1:]
		delete(d.readySet, org)
		if d.owned[org] != nil {
			return org, true
		}
	}
	d.ready = nil // the backing array of a long queue is not kept
	return "", false
}

// readyStep takes the next step for an org whose run here ended, as a cycle would but from
// a poll of that org's jobs alone: its next job starts at once, not at the next tick after
// a poll of every org's.
func (d *Dispatcher) readyStep(ctx context.Context, org string) error {
	if !d.cfg.ClaimEnabled || d.isStopping() {
		return nil
	}
	if err := d.gate(ctx); err != nil {
		return err
	}
	d.metrics.readySteps.Inc()
	snap, err := d.poll(ctx, sartiq.ListJobsParams{OrganizationID: org,
		Status: sartiq.StatusQueued + "," + sartiq.StatusClaimed + "," + sartiq.StatusRunning})
	if err != nil {
		return err
	}
	// Owned orgs only: one whose lease was lost since is the cycles' to own again.
	snap.others = map[string]bool{org: true}
	_, err = d.work(ctx, org, snap, true)
	return err
}

// poll lists jobs of every type with p's filter, following cursors.
func (d *Dispatcher) poll(ctx context.Context, p sartiq.ListJobsParams) (*snapshot, error) {
	snap := &snapshot{queued: map[string][]sartiq.Job{}, active: map[string][]sartiq.Job{}}
	seen := map[string]bool{}
	for _, typ := range JobTypes {
		p.Type, p.Limit, p.Cursor = typ, 100, ""
		for page := 0; ; page++ {
			res, err := d.cfg.Bot.ListJobs(ctx, p)
			if err != nil {
				return nil, fmt.Errorf("poll %s jobs: %w", typ, err)
			}
			for _, job := range res.Jobs {
				org := job.OrganizationID
				if !seen[org] {
					seen[org] = true
					snap.orgs = append(snap.orgs, org)
				}
				if job.Status == sartiq.StatusQueued {
					snap.queued[org] = append(snap.queued[org], job)
				} else {
					snap.active[org] = append(snap.active[org], job)
				}
			}
			if res.NextCursor == "" {
				break
			}
			if page+1 >= maxPages {
				d.cfg.Log.Warn("poll stopped at its page limit; the rest waits for the next cycle", "type", typ, "pages", maxPages)
				break
			}
			p.Cursor = res.NextCursor
		}
	}
	// The backend lists one type at a time, each oldest first: across types, the oldest
	// job comes first too (a crashed job queued again keeps its place ahead of newer jobs
	// of another type), and so does the org whose oldest job is oldest.
	oldest := map[string]time.Time{}
	for _, org := range snap.orgs {
		for _, jobs := range [][]sartiq.Job{snap.queued[org], snap.active[org]} {
			slices.SortStableFunc(jobs, func(a, b sartiq.Job) int {
				return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), cmp.Compare(a.ID, b.ID))
			})
			if len(jobs) > 0 && (oldest[org].IsZero() || jobs[0].CreatedAt.Before(oldest[org])) {
				oldest[org] = jobs[0].CreatedAt
			}
		}
	}
	slices.SortStableFunc(snap.orgs, func(a, b string) int { return oldest[a].Compare(oldest[b]) })
	return snap, nil
}

// work takes one step for org: nothing while a job of its is in flight here, while
// another replica owns it or while a step for it is being taken already (by a cycle or
// the ready loop); else, under its org: lease, re-claim a stale job or claim the oldest
// queued one. It reports whether a job started. A ready step (ready) that finds a cycle
// working org has it kicked again when the cycle's step ends.
func (d *Dispatcher) work(ctx context.Context, org string, snap *snapshot, ready bool) (bool, error) {
	d.mu.Lock()
	if d.working[org] {
		if ready {
			d.again[org] = true
		}
		d.mu.Unlock()
		return false, nil
	}
	d.working[org] = true
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		delete(d.working, org)
		again := d.again[org]
		delete(d.again, org)
		d.mu.Unlock()
		if again {
			d.kick(org)
		}
	}()
	return d.step(ctx, org, snap)
}

func (d *Dispatcher) step(ctx context.Context, org string, snap *snapshot) (bool, error) {
	d.mu.Lock()
	if b, ok := d.backoff[org]; ok && time.Now().Before(b.until) {
		d.mu.Unlock()
		return false, nil
	}
	if _, busy := d.inFlight[org]; busy {
		if o := d.owned[org]; o != nil {
			o.lastWork = time.Now()
		}
		d.mu.Unlock()
		return false, nil
	}
	o := d.owned[org]
	if o == nil {
		// Steps run side by side: an acquire under way holds its place under MaxOrgs.
		if len(d.owned)+d.acquiring >= d.cfg.MaxOrgs || snap.others[org] {
			d.mu.Unlock()
			return false, nil
		}
		d.acquiring++
	}
	d.mu.Unlock()

	active := snap.active[org]
	if o == nil {
		l, err := d.leases.TryAcquire(ctx, "org:"+org, d.holder, d.cfg.LeaseTTL)
		d.mu.Lock()
		d.acquiring--
		if err == nil {
			o = &ownership{lease: l, lastWork: time.Now()}
			d.owned[org] = o
			d.metrics.owned.Set(float64(len(d.owned)))
		}
		d.mu.Unlock()
		if errors.Is(err, lease.ErrHeld) {
			return false, nil // another replica's
		}
		if err != nil {
			return false, fmt.Errorf("own org %s: %w", org, err)
		}
		d.cfg.Log.Info("org owned", "org", org, "epoch", l.Epoch)
		// The poll predates the ownership: a previous owner may have claimed since. What
		// the backend says now decides.
		if active, err = d.activeJobs(ctx, org); err != nil {
			return false, err
		}
		if err := d.reconcile(ctx, org, active); err != nil {
			return false, err
		}
	}
	d.mu.Lock()
	o.lastWork = time.Now()
	d.mu.Unlock()
	var stale *sartiq.Job
	for i, job := range active {
		if !job.Stale {
			// A worker is alive on it (ours that just ended has reported by now, so
			// this is someone else's, or a crashed one not yet stale).
			return false, nil
		}
		if stale == nil {
			stale = &active[i]
		}
	}
	if stale != nil {
		return d.recover(ctx, org, *stale)
	}
	for _, job := range snap.queued[org] {
		ok, err := d.claim(ctx, org, job)
		if ok || err != nil {
			return ok, err
		}
	}
	return false, nil
}

// activeJobs asks the backend for org's CLAIMED and RUNNING jobs.
func (d *Dispatcher) activeJobs(ctx context.Context, org string) ([]sartiq.Job, error) {
	snap, err := d.poll(ctx, sartiq.ListJobsParams{Status: sartiq.StatusClaimed + "," + sartiq.StatusRunning, OrganizationID: org})
	if err != nil {
		return nil, fmt.Errorf("check org %s as its new owner: %w", org, err)
	}
	return snap.active[org], nil
}

// prepareClaim takes what a claim for org needs before it is made: the org: lease still
// ours (refreshed, so a replica that woke late finds out here) and the home: lease. It
// returns the org's slot reserved, or ok false when the org is not to be claimed for now.
func (d *Dispatcher) prepareClaim(ctx context.Context, org string) (*delivery, bool, error) {
	d.mu.Lock()
	o := d.owned[org]
	if d.stopping || o == nil || d.inFlight[org] != nil {
		d.mu.Unlock()
		return nil, false, nil
	}
	dl := newDelivery(d.hard)
	d.inFlight[org] = dl
	d.metrics.inFlight.Set(float64(len(d.inFlight)))
	held := o.lease
	d.mu.Unlock()
	ok := false
	defer func() {
		if !ok {
			d.free(org, dl)
		}
	}()
	refreshed, err := d.leases.Refresh(ctx, held, d.cfg.LeaseTTL)
	if errors.Is(err, lease.ErrLost) {
		d.disown(held, "the org lease was lost")
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("refresh org %s: %w", org, err)
	}
	d.mu.Lock()
	if d.owned[org] == o {
		o.lease = refreshed
	}
	d.mu.Unlock()
	home, err := d.leases.TryAcquire(ctx, "home:"+org, d.holder, d.cfg.LeaseTTL)
	if errors.Is(err, lease.ErrHeld) {
		d.cfg.Log.Info("org home busy (a chat turn or another agent); the job waits", "org", org, "err", err)
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("take home:%s: %w", org, err)
	}
	dl.home = home
	ok = true
	return dl, true, nil
}

// claim claims job for org and starts it. ok false with no error: not claimed (the org is
// not ours or busy, or another claimant won the job).
func (d *Dispatcher) claim(ctx context.Context, org string, job sartiq.Job) (bool, error) {
	dl, ok, err := d.prepareClaim(ctx, org)
	if !ok {
		return false, err
	}
	c, err := d.cfg.Bot.Claim(ctx, job.ID)
	if err != nil {
		d.giveBack(org, dl)
		if sartiq.IsConflict(err) {
			return false, nil
		}
		return false, fmt.Errorf("claim job %s: %w", job.ID, err)
	}
	d.metrics.claims.WithLabelValues("claim").Inc()
	if d.wrongOrg(ctx, org, c) {
		d.giveBack(org, dl)
		return false, nil
	}
	d.start(ctx, dl, c, "claim")
	return true, nil
}

// wrongOrg checks that a claim answered for the org the dispatcher reserved (its slot,
// its home lease): one that names another org is released at once with its own token,
// unrun and logged, and the caller frees the reservation. The org's work is never run in
// another org's home.
func (d *Dispatcher) wrongOrg(ctx context.Context, org string, c *sartiq.Claim) bool {
	if c.OrganizationID == org && c.Job.OrganizationID == org {
		return false
	}
	reason := fmt.Sprintf("the claim answered for organization %q (job's %q), not %q, which the dispatcher reserved: released unrun",
		c.OrganizationID, c.Job.OrganizationID, org)
	d.metrics.wrongOrg.Inc()
	d.cfg.Log.Error("claim for the wrong organization", "job", c.Job.ID, "reserved", org, "claimed_org", c.OrganizationID, "job_org", c.Job.OrganizationID)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	api, err := sartiq.New(d.cfg.APIURL, c.JobToken)
	if err == nil {
		_, err = api.Release(rctx, c.Job.ID, reason)
	}
	if err != nil {
		d.cfg.Log.Warn("release a claim for the wrong organization", "job", c.Job.ID, "err", err)
	}
	return true
}

// giveBack ends org's hold on a run, claimed or not: the home lease is released and the
// org's slot freed.
func (d *Dispatcher) giveBack(org string, dl *delivery) {
	if dl.home.Key != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := d.leases.Release(ctx, dl.home); err != nil && !errors.Is(err, lease.ErrLost) {
			d.cfg.Log.Warn("release home lease", "org", org, "err", err)
		}
	}
	d.free(org, dl)
}

func (d *Dispatcher) free(org string, dl *delivery) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.inFlight[org] == dl {
		delete(d.inFlight, org)
	}
	d.metrics.inFlight.Set(float64(len(d.inFlight)))
}

// disown drops the org of l, a lost org: lease, while it is still the holding owned.
func (d *Dispatcher) disown(l lease.Lease, why string) {
	org := strings.TrimPrefix(l.Key, "org:")
	d.mu.Lock()
	// Only the holding that was lost: the org may have been given up and taken again
	// since, at a new epoch.
	o := d.owned[org]
	if o == nil || o.lease.Epoch != l.Epoch {
		d.mu.Unlock()
		return
	}
	delete(d.owned, org)
	d.metrics.owned.Set(float64(len(d.owned)))
	d.mu.Unlock()
	d.cfg.Log.Warn("org no longer owned", "org", org, "reason", why)
}

// releaseIdle gives up orgs that showed no work for OrgIdle, so replicas share orgs. An org
// whose dashboard starts or runs here is not idle: its next request must come back here.
func (d *Dispatcher) releaseIdle(ctx context.Context, snap *snapshot) {
	now := time.Now()
	var idle []lease.Lease
	d.mu.Lock()
	for org, o := range d.owned {
		if d.inFlight[org] != nil || d.working[org] || d.dash.holds(org) || len(snap.queued[org])+len(snap.active[org]) > 0 || now.Sub(o.lastWork) < d.cfg.OrgIdle {
			continue
		}
		idle = append(idle, o.lease)
		delete(d.owned, org)
	}
	d.metrics.owned.Set(float64(len(d.owned)))
	d.mu.Unlock()
	for _, l := range idle {
		if err := d.leases.Release(ctx, l); err != nil && !errors.Is(err, lease.ErrLost) {
			d.cfg.Log.Warn("give up an idle org", "key", l.Key, "err", err)
		}
	}
}

// KeepOwnership refreshes the org: leases every third of LeaseTTL until ctx ends; an org
// whose lease was lost is dropped (its job in flight, if any, runs on under its home:
// lease, and the next owner waits for it to end). A round refreshes every owned lease in
// one statement (lease.RefreshAll): one commit, where a commit per lease made a round's
// length grow with the orgs owned, and on a saturated machine pass the leases' TTL.
func (d *Dispatcher) KeepOwnership(ctx context.Context) {
	t := time.NewTicker(d.cfg.LeaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		d.keepRound(ctx)
	}
}

// keepRound refreshes every owned org: lease once.
func (d *Dispatcher) keepRound(ctx context.Context) {
	began := time.Now()
	d.mu.Lock()
	held := make([]lease.Lease, 0, len(d.owned))
	for _, o := range d.owned {
		held = append(held, o.lease)
	}
	d.mu.Unlock()
	kept, lost, err := d.leases.RefreshAll(ctx, held, d.cfg.LeaseTTL)
	if err != nil && ctx.Err() == nil {
		d.cfg.Log.Warn("refresh the org leases", "orgs", len(held), "err", err)
	}
	d.mu.Lock()
	for _, l := range kept {
		if o := d.owned[strings.TrimPrefix(l.Key, "org:")]; o != nil && o.lease.Epoch == l.Epoch {
			o.lease = l
		}
	}
	d.mu.Unlock()
	for _, l := range lost {
		d.disown(l, "the org lease was lost")
	}
	took := time.Since(began)
	d.metrics.keepRound.Observe(took.Seconds())
	if took > d.cfg.LeaseTTL/3 && ctx.Err() == nil {
		d.cfg.Log.Warn("refreshing the org leases took longer than their refresh interval",
			"orgs", len(held), "took", took.String(), "interval", (d.cfg.LeaseTTL / 3).String())
	}
}

// Owned lists the orgs this dispatcher owns.
func (d *Dispatcher) Owned() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]string, 0, len(d.owned))
	for org := range d.owned {
		out = append(out, org)
	}
	return out
}

func (d *Dispatcher) isStopping() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stopping
}
