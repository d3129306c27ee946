package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"hermeshost/assertion"
	"hermeshost/dashboards"
	"hermeshost/dispatch/runtime"
	"hermeshost/gateway"
	"hermeshost/internal/unitnet"
	"hermeshost/lease"
	"hermeshost/orghome"
)

// Dashboards: the launcher asks for an org's dashboard by making its row requested; the
// dispatcher that owns the org (or takes it, when nobody does) starts `hermes-host dashboard`
// through its runtime on a free loopback port, hands it its keys on stdin, waits for
// /healthz and records the URL. It stops dashboards that went unused, records the ones that
// died, and keeps the org while its dashboard runs here.

// Defaults for the dashboard settings of Config.
const (
	DefaultDashboardIdle  = 30 * time.Minute
	DefaultDashboardCheck = 3 * time.Second
)

const (
	// dashboardHealthWait bounds how long a started dashboard may take to answer /healthz.
	dashboardHealthWait = 20 * time.Second
	// dashboardStartTries: a dashboard that exits before it answers (most likely its port
	// was taken between our pick and its bind) is tried once more on another port.
	dashboardStartTries = 2
	// dashboardUnitCheck is how often a start waiting for /healthz asks the runtime
	// whether the dashboard is still alive, so that one that exited fails at once.
	dashboardUnitCheck = 500 * time.Millisecond
)

// Why a dashboard was stopped: the label of hermes_dashboards_stopped_total.
const (
	stopIdle        = "idle"        // unused for DashboardIdle
	stopDied        = "died"        // its unit is no longer running
	stopInterrupted = "interrupted" // a start of this instance's that no process finishes
	stopStray       = "stray"       // a unit no row of this instance's records
	stopShutdown    = "shutdown"    // the dispatcher stopped, and its units with it
)

// errDashboardExited says the dashboard's unit ended before it answered.
var errDashboardExited = errors.New("the dashboard exited before it answered /healthz")

// dashboardsHere is what this dispatcher knows of the dashboards it starts or runs; it is
// guarded by Dispatcher.mu.
type dashboardsHere struct {
	starting map[string]bool   // a start of the org's dashboard runs now
	begun    map[string]uint64 // starts begun per org, so a check that overlapped one leaves it alone
	running  map[string]bool   // recorded running for this instance when last checked
}

func newDashboardsHere() dashboardsHere {
	return dashboardsHere{starting: map[string]bool{}, begun: map[string]uint64{}, running: map[string]bool{}}
}

// holds says org's dashboard starts or runs here: the org is not idle.
func (h *dashboardsHere) holds(org string) bool { return h.starting[org] || h.running[org] }

type dashboardMetrics struct {
	started   prometheus.Counter
	failed    prometheus.Counter
	stopped   *prometheus.CounterVec
	startTime prometheus.Histogram
}

func newDashboardMetrics(reg prometheus.Registerer) *dashboardMetrics {
	m := &dashboardMetrics{
		started: prometheus.NewCounter(prometheus.CounterOpts{Name: "hermes_dashboards_started_total",
			Help: "Org dashboards started and recorded running."}),
		failed: prometheus.NewCounter(prometheus.CounterOpts{Name: "hermes_dashboards_start_failures_total",
			Help: "Org dashboard starts that failed (recorded failed, with the reason)."}),
		stopped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hermes_dashboards_stopped_total",
			Help: "Org dashboards stopped or found gone, by reason (idle, died, interrupted, stray, shutdown)."}, []string{"reason"}),
		startTime: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "hermes_dashboards_start_seconds",
			Help: "From taking a dashboard request to its /healthz answering.", Buckets: prometheus.ExponentialBuckets(0.05, 2, 10)}),
	}
	if reg != nil {
		reg.MustRegister(m.started, m.failed, m.stopped, m.startTime)
	}
	return m
}

// RunDashboards serves dashboard requests until ctx ends: at every notification and every
// DashboardCheck it starts the requested dashboards of the orgs it owns or can take, stops
// its idle ones, and records the ones that died. Without Config.Dashboards it returns at
// once; without DashboardSecret (or the control API) it starts none, says so once, and
// leaves the requests to a dispatcher that can. When ctx ends it waits for the starts in
// progress (they give their requests back) and then, unless KeepDashboards, stops its
// dashboards and records them stopped.
func (d *Dispatcher) RunDashboards(ctx context.Context) {
	store := d.cfg.Dashboards
	if store == nil {
		return
	}
	canStart := d.cfg.DashboardSecret != "" && d.cfg.ControlURL != "" && d.cfg.ControlKey != nil
	if !canStart {
		d.cfg.Log.Warn("dashboards cannot be started here: DASHBOARD_SECRET (or the control API) is not configured; requests are left for a dispatcher that has it")
	}
	wake := store.Wake()
	t := time.NewTicker(d.cfg.DashboardCheck)
	defer t.Stop()
	var starts sync.WaitGroup
	for {
		d.checkDashboards(ctx)
		if canStart {
			d.startPending(ctx, &starts)
		}
		select {
		case <-ctx.Done():
			starts.Wait()
			d.endDashboards()
			return
		case <-wake:
		case <-t.C:
		}
	}
}

// startPending starts, each in its own goroutine, the requested dashboards this dispatcher
// may take: those of orgs it owns, and those of orgs no other replica holds.
func (d *Dispatcher) startPending(ctx context.Context, starts *sync.WaitGroup) {
	pending, err := d.cfg.Dashboards.Pending(ctx)
	if err != nil {
		if ctx.Err() == nil {
			d.cfg.Log.Warn("list dashboard requests", "err", err)
		}
		return
	}
	if len(pending) == 0 {
		return
	}
	// One read of who holds which org spares an acquire that must fail.
	infos, err := d.leases.List(ctx, "org:")
	if err != nil {
		if ctx.Err() == nil {
			d.cfg.Log.Warn("read org ownership for dashboard requests", "err", err)
		}
		return
	}
	others := map[string]bool{}
	now := time.Now()
	for _, in := range infos {
		if in.Holder != d.holder && in.Held(now) {
			others[strings.TrimPrefix(in.Key, "org:")] = true
		}
	}
	for _, p := range pending {
		org := p.Org
		d.mu.Lock()
		skip := d.stopping || d.dash.starting[org] || (d.owned[org] == nil && others[org])
		if !skip {
			d.dash.starting[org] = true
			d.dash.begun[org]++
		}
		d.mu.Unlock()
		if skip {
			continue
		}
		starts.Go(func() {
			defer func() {
				d.mu.Lock()
				delete(d.dash.starting, org)
				d.mu.Unlock()
			}()
			d.startDashboard(ctx, org, p.RequestedBy)
		})
	}
}

// ownForDashboard makes sure this dispatcher owns org before it starts its dashboard: it
// owns it already, or takes its org: lease as a cycle does (within MaxOrgs). fresh says the
// lease was taken now.
func (d *Dispatcher) ownForDashboard(ctx context.Context, org string) (owned, fresh bool) {
	d.mu.Lock()
	o, full := d.owned[org], len(d.owned) >= d.cfg.MaxOrgs
	d.mu.Unlock()
	if o != nil {
		return true, false
	}
	if full {
		d.cfg.Log.Debug("dashboard request waits: this dispatcher owns MAX_ORGS orgs", "org", org)
		return false, false
	}
	l, err := d.leases.TryAcquire(ctx, "org:"+org, d.holder, d.cfg.LeaseTTL)
	var held *lease.HeldError
	if errors.As(err, &held) {
		// Ours when a cycle took the org at the same moment; then it is recorded by now or
		// on the next look.
		d.mu.Lock()
		o = d.owned[org]
		d.mu.Unlock()
		return o != nil, false
	}
	if err != nil {
		if ctx.Err() == nil {
			d.cfg.Log.Warn("own org for its dashboard", "org", org, "err", err)
		}
		return false, false
	}
	d.mu.Lock()
	d.owned[org] = &ownership{lease: l, lastWork: time.Now()}
	d.metrics.owned.Set(float64(len(d.owned)))
	d.mu.Unlock()
	d.cfg.Log.Info("org owned", "org", org, "epoch", l.Epoch, "for", "dashboard")
	return true, true
}

// startDashboard takes org's request, starts its dashboard and records the outcome.
func (d *Dispatcher) startDashboard(ctx context.Context, org, by string) {
	log := d.cfg.Log.With("org", org)
	owned, fresh := d.ownForDashboard(ctx, org)
	if !owned {
		return
	}
	store, instance := d.cfg.Dashboards, d.cfg.Instance
	took, err := store.Start(ctx, org, instance)
	if err != nil || !took {
		if err != nil && ctx.Err() == nil {
			log.Warn("take a dashboard request", "err", err)
		}
		return
	}
	log.Info("dashboard starting", "requested_by", by)
	began := time.Now()
	url, err := d.launchDashboard(ctx, org, log)
	rec, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err == nil {
		if err = store.Running(rec, org, instance, url); err != nil {
			err = fmt.Errorf("record it running: %w", err)
		}
	}
	if err != nil {
		d.stopDashboardUnit(rec, org, log)
		if ctx.Err() != nil {
			// The dispatcher is stopping: not the dashboard's failure. Another replica
			// (or this one's next start) takes the request.
			if err := store.Requeue(rec, org, instance); err != nil {
				log.Warn("give back a dashboard request", "err", err)
			}
			log.Info("dashboard start given back: the dispatcher is stopping")
			return
		}
		reason := "the host could not start the dashboard: " + err.Error()
		d.dashMetrics.failed.Inc()
		if ferr := store.Fail(rec, org, instance, reason); ferr != nil {
			log.Warn("record a dashboard failure", "err", ferr)
		}
		log.Warn("dashboard failed", "reason", reason)
		return
	}
	elapsed := time.Since(began)
	d.mu.Lock()
	d.dash.running[org] = true
	d.mu.Unlock()
	d.dashMetrics.started.Inc()
	d.dashMetrics.startTime.Observe(elapsed.Seconds())
	log.Info("dashboard running", "url", url, "took", elapsed.String())
	if fresh {
		// What a cycle does for a new owner, so that its next claim may rely on it.
		active, err := d.activeJobs(ctx, org)
		if err == nil {
			err = d.reconcile(ctx, org, active)
		}
		if err != nil && ctx.Err() == nil {
			log.Warn("check the org's jobs as its new owner", "err", err)
		}
	}
}

// launchDashboard starts org's dashboard on the socket the runtime gives it and returns
// the URL the host reaches it at once /healthz answers there.
func (d *Dispatcher) launchDashboard(ctx context.Context, org string, log *slog.Logger) (string, error) {
	if err := d.ensureSoul(org); err != nil {
		return "", err
	}
	secrets, err := d.dashboardSecrets(org)
	if err != nil {
		return "", err
	}
	listen, reach := d.cfg.Runtime.DashboardAddr(org)
	for try := 1; ; try++ {
		// A dashboard already running (one the launcher could not reach, say) is replaced:
		// EnsureDashboard keeps a running one as it is.
		if err := d.cfg.Runtime.Stop(ctx, org, runtime.RoleDashboard); err != nil {
			return "", fmt.Errorf("stop the previous dashboard: %w", err)
		}
		if _, err := d.cfg.Runtime.EnsureDashboard(ctx, org, runtime.Dashboard{
			Args:    []string{"hermes-host", "dashboard", "--org", org, "--addr", listen},
			Secrets: secrets,
			Env:     append(d.egressEnv(org), d.cfg.DashboardEnv...),
		}); err != nil {
			return "", err
		}
		err = d.awaitHealthy(ctx, org, reach)
		if err == nil {
			return reach, nil
		}
		if !errors.Is(err, errDashboardExited) || try == dashboardStartTries {
			return "", fmt.Errorf("%w (try %d of %d)", err, try, dashboardStartTries)
		}
		log.Info("dashboard exited before it answered; starting it again")
	}
}

// ensureSoul makes org's home and its SOUL.md before a worker or a dashboard starts: the
// runtime mounts SOUL.md read-only.
func (d *Dispatcher) ensureSoul(org string) error {
	if err := orghome.ValidID(org); err != nil {
		return err
	}
	dir := filepath.Join(d.cfg.OrgsRoot, org)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("make the home of %s: %w", org, err)
	}
	home, err := orghome.OpenHome(org, dir)
	if err != nil {
		return err
	}
	defer home.Close()
	_, err = home.EnsureSoul(orghome.Identity{OrgID: org, DisplayName: org})
	return err
}

// dashboardSecrets are the KEY=VALUE lines the dashboard reads on stdin: the org's own
// control-API, gateway and assertion keys, never another org's.
func (d *Dispatcher) dashboardSecrets(org string) ([]string, error) {
	controlKey, err := d.cfg.ControlKey(org)
	if err != nil {
		return nil, fmt.Errorf("control key: %w", err)
	}
	gatewayKey, err := gateway.OrgKey(d.cfg.GatewaySecret.Reveal(), org)
	if err != nil {
		return nil, fmt.Errorf("gateway key: %w", err)
	}
	assertionKey, err := assertion.OrgKey(d.cfg.DashboardSecret.Reveal(), org)
	if err != nil {
		return nil, err
	}
	return []string{
		"CONTROL_URL=" + d.unitURL(org, ServiceControl, d.cfg.ControlURL), "CONTROL_KEY=" + controlKey,
		"GATEWAY_URL=" + d.unitURL(org, ServiceGateway, d.cfg.GatewayURL), "GATEWAY_KEY=" + gatewayKey,
		"DASHBOARD_ASSERTION_KEY=" + assertionKey,
	}, nil
}

// awaitHealthy waits up to dashboardHealthWait for GET /healthz at reach (a unix: URL) to answer 200,
// looking again after 50ms, then less often (up to every 500ms). A unit that exited fails
// it at once with errDashboardExited.
func (d *Dispatcher) awaitHealthy(ctx context.Context, org, reach string) error {
	sock, ok := unitnet.SocketPath(reach)
	if !ok {
		return fmt.Errorf("the runtime gave the dashboard %q, not a unix: URL", reach)
	}
	// No idle connections are kept: nothing of this probe outlives it.
	client := unitnet.HTTPClient(sock, 2*time.Second)
	deadline := time.Now().Add(dashboardHealthWait)
	lastUnitCheck := time.Now()
	wait := 50 * time.Millisecond
	for {
		last := probeHealth(ctx, client, "http://dashboard/healthz")
		if last == "" {
			return nil
		}
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the dashboard did not answer /healthz within %s (last: %s)", dashboardHealthWait, last)
		}
		if time.Since(lastUnitCheck) >= dashboardUnitCheck {
			lastUnitCheck = time.Now()
			up, err := d.dashboardUnitUp(ctx, org)
			if err != nil {
				return err
			}
			if !up {
				return errDashboardExited
			}
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(wait):
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}

// probeHealth is "" when url answers 200, else what it did.
func probeHealth(ctx context.Context, client *http.Client, url string) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err.Error()
	}
	resp, err := client.Do(req)
	if err != nil {
		return err.Error()
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return resp.Status
	}
	return ""
}

// dashboardUnits is which orgs have a running dashboard unit of this instance.
func (d *Dispatcher) dashboardUnits(ctx context.Context) (map[string]bool, error) {
	units, err := d.cfg.Runtime.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list the runtime's units: %w", err)
	}
	up := map[string]bool{}
	for _, u := range units {
		if u.Role == runtime.RoleDashboard && u.Running {
			up[u.Org] = true
		}
	}
	return up, nil
}

func (d *Dispatcher) dashboardUnitUp(ctx context.Context, org string) (bool, error) {
	up, err := d.dashboardUnits(ctx)
	return up[org], err
}

func (d *Dispatcher) stopDashboardUnit(ctx context.Context, org string, log *slog.Logger) {
	if err := d.cfg.Runtime.Stop(ctx, org, runtime.RoleDashboard); err != nil {
		log.Warn("stop a dashboard", "err", err)
	}
}

// checkDashboards reconciles this instance's rows with its units: a running dashboard idle
// past DashboardIdle is stopped; one whose unit is gone, or a start that no process of
// this instance finishes, is recorded stopped (the next request starts it again); a
// dashboard unit no row of this instance records is stopped; a running one not yet known
// (adopted after a restart) keeps its org owned here. Orgs with a start in progress, or
// begun while the check read, are left to that start.
func (d *Dispatcher) checkDashboards(ctx context.Context) {
	d.mu.Lock()
	busy, begun := maps.Clone(d.dash.starting), maps.Clone(d.dash.begun)
	d.mu.Unlock()
	settledLocked := func(org string) bool {
		return !busy[org] && !d.dash.starting[org] && d.dash.begun[org] == begun[org]
	}
	settled := func(org string) bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return settledLocked(org)
	}
	// Units first: a unit listed now was recorded starting before it existed, so the rows
	// read next account for it.
	up, err := d.dashboardUnits(ctx)
	if err != nil {
		if ctx.Err() == nil {
			d.cfg.Log.Warn("check dashboards", "err", err)
		}
		return
	}
	store, instance := d.cfg.Dashboards, d.cfg.Instance
	rows, err := store.OfInstance(ctx, instance)
	if err != nil {
		if ctx.Err() == nil {
			d.cfg.Log.Warn("check dashboards", "err", err)
		}
		return
	}
	recorded := map[string]bool{}
	running := map[string]bool{}
	for _, r := range rows {
		recorded[r.Org] = true
		if !settled(r.Org) {
			continue
		}
		log := d.cfg.Log.With("org", r.Org)
		switch {
		case r.State == dashboards.Starting:
			d.stopDashboardUnit(ctx, r.Org, log)
			d.recordStopped(ctx, r.Org, stopInterrupted, "a start of this instance that no process of it finishes (the dispatcher restarted mid-start)", slog.LevelWarn)
		case !up[r.Org]:
			d.recordStopped(ctx, r.Org, stopDied, "its unit is no longer running; the next request starts it again", slog.LevelWarn)
		default:
			idle, err := store.StopIfIdle(ctx, r.Org, instance, d.cfg.DashboardIdle)
			if err != nil {
				log.Warn("check a dashboard's idle time", "err", err)
			}
			if idle {
				d.stopDashboardUnit(ctx, r.Org, log)
				d.dashMetrics.stopped.WithLabelValues(stopIdle).Inc()
				log.Info("dashboard stopped", "reason", stopIdle, "idle_timeout", d.cfg.DashboardIdle.String())
				continue
			}
			running[r.Org] = true
		}
	}
	for org := range up {
		if !recorded[org] && settled(org) {
			log := d.cfg.Log.With("org", org)
			d.stopDashboardUnit(ctx, org, log)
			d.dashMetrics.stopped.WithLabelValues(stopStray).Inc()
			log.Info("dashboard stopped", "reason", stopStray)
		}
	}
	d.mu.Lock()
	var adopted []string
	for org := range running {
		if !d.dash.running[org] {
			adopted = append(adopted, org)
		}
	}
	for org := range d.dash.running {
		if !running[org] && settledLocked(org) {
			delete(d.dash.running, org)
		}
	}
	maps.Copy(d.dash.running, running)
	d.mu.Unlock()
	for _, org := range adopted {
		d.cfg.Log.Info("dashboard adopted", "org", org)
		if d.isStopping() {
			continue
		}
		if owned, _ := d.ownForDashboard(ctx, org); !owned {
			d.cfg.Log.Info("the adopted dashboard's org is owned elsewhere; the dashboard runs on here", "org", org)
		}
	}
}

// recordStopped records org's dashboard of this instance stopped, for reason.
func (d *Dispatcher) recordStopped(ctx context.Context, org, reason, why string, level slog.Level) {
	log := d.cfg.Log.With("org", org)
	err := d.cfg.Dashboards.Stopped(ctx, org, d.cfg.Instance)
	if errors.Is(err, dashboards.ErrNotHeld) {
		return // moved on since it was read
	}
	if err != nil {
		log.Warn("record a dashboard stopped", "reason", reason, "err", err)
		return
	}
	d.dashMetrics.stopped.WithLabelValues(reason).Inc()
	log.Log(ctx, level, "dashboard stopped", "reason", reason, "detail", why)
}

// endDashboards runs once RunDashboards' context has ended and its starts are over. A
// process runtime's dashboards die with the dispatcher, and a dispatcher that removes its
// units on exit (dev) removes them too: either way they are stopped now and recorded
// stopped, so the launcher's next request starts them again. With KeepDashboards (Docker in
// production) they keep running for the next start of this instance to adopt.
func (d *Dispatcher) endDashboards() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := d.cfg.Dashboards.OfInstance(ctx, d.cfg.Instance)
	if err != nil {
		d.cfg.Log.Warn("dashboards at shutdown", "err", err)
		return
	}
	if d.cfg.KeepDashboards && d.cfg.Runtime.Kind() != "process" {
		if len(rows) > 0 {
			d.cfg.Log.Info("dashboards left running for the next start to adopt", "count", len(rows))
		}
		return
	}
	for _, r := range rows {
		log := d.cfg.Log.With("org", r.Org)
		d.stopDashboardUnit(ctx, r.Org, log)
		d.recordStopped(ctx, r.Org, stopShutdown, "the dispatcher stopped", slog.LevelInfo)
	}
	d.mu.Lock()
	clear(d.dash.running)
	d.mu.Unlock()
}
