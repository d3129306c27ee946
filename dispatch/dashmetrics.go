package dispatch

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"hermeshost/internal/unitnet"
)

// A dashboard serves its own /metrics on its org's socket (the chat sweeps' counters among
// them), which no Prometheus reaches. The dispatcher that runs it gathers them when its
// /metrics/dashboards is scraped, each series labelled with its org.
const (
	// dashScrapeTimeout bounds one dashboard's answer; dashScrapeMax its size and
	// dashScrapeSeries the series taken from it. What a dashboard serves is what its unit
	// makes of it (a chat turn's agent runs there), so it is read as untrusted: bounded,
	// and its org label is the dispatcher's, never its own.
	dashScrapeTimeout = 3 * time.Second
	dashScrapeMax     = 4 << 20
	dashScrapeSeries  = 5000
	// dashScrapeParallel is how many dashboards are asked at once.
	dashScrapeParallel = 8
	// dashUpMetric says, per org, whether its dashboard answered this gathering.
	dashUpMetric = "hermes_dashboard_scrape_up"
)

// dashTarget is a dashboard to gather: its org and the unix: URL it is reached at.
type dashTarget struct{ org, reach string }

// DashboardMetrics serves the /metrics of every dashboard running here, gathered at each
// request, with an org label on every series, and hermes_dashboard_scrape_up{org} (1 when
// the dashboard answered, 0 when it did not; the log says why). A request's context bounds
// the gathering, as a scrape's timeout does.
func (d *Dispatcher) DashboardMetrics() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d.mu.Lock()
		orgs := slices.Sorted(maps.Keys(d.dash.running))
		d.mu.Unlock()
		targets := make([]dashTarget, 0, len(orgs))
		for _, org := range orgs {
			_, reach := d.cfg.Runtime.DashboardAddr(org)
			targets = append(targets, dashTarget{org: org, reach: reach})
		}
		families := gatherDashboards(r.Context(), targets, func(org string, err error) {
			d.cfg.Log.Warn("gather a dashboard's metrics", "org", org, "err", err)
		})
		// The text format, which every Prometheus reads.
		format := expfmt.NewFormat(expfmt.TypeTextPlain)
		w.Header().Set("Content-Type", string(format))
		enc := expfmt.NewEncoder(w, format)
		for _, mf := range families {
			if err := enc.Encode(mf); err != nil {
				return // the scraper went away
			}
		}
	})
}

// gatherDashboards asks each target for its /metrics, dashScrapeParallel at once, and merges
// what they answered into families sorted by name, each series with its target's org label;
// failed hears of each target that did not answer well. A family one dashboard gives a
// type another gave otherwise keeps the first type's series only.
func gatherDashboards(ctx context.Context, targets []dashTarget, failed func(org string, err error)) []*dto.MetricFamily {
	got := make([]map[string]*dto.MetricFamily, len(targets))
	errs := make([]error, len(targets))
	sem := make(chan struct{}, dashScrapeParallel)
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			got[i], errs[i] = scrapeDashboard(ctx, t)
		})
	}
	wg.Wait()

	up := &dto.MetricFamily{Name: new(dashUpMetric), Type: dto.MetricType_GAUGE.Enum(),
		Help: new("Whether the org's dashboard, running under this dispatcher, answered its /metrics at this gathering (1) or not (0).")}
	merged := map[string]*dto.MetricFamily{dashUpMetric: up}
	for i, t := range targets {
		v := 1.0
		if errs[i] != nil {
			v = 0
			failed(t.org, errs[i])
		}
		up.Metric = append(up.Metric, &dto.Metric{Label: []*dto.LabelPair{orgLabel(t.org)}, Gauge: &dto.Gauge{Value: &v}})
		for _, name := range slices.Sorted(maps.Keys(got[i])) {
			mf := got[i][name]
			have, ok := merged[name]
			switch {
			case !ok:
				merged[name] = mf
			case name == dashUpMetric || have.GetType() != mf.GetType():
				failed(t.org, fmt.Errorf("its family %s is not the one the others serve; left out", name))
			default:
				have.Metric = append(have.Metric, mf.Metric...)
			}
		}
	}
	// A family without series cannot be written (no dashboard runs here: no up series).
	maps.DeleteFunc(merged, func(_ string, mf *dto.MetricFamily) bool { return len(mf.Metric) == 0 })
	return slices.SortedFunc(maps.Values(merged), func(a, b *dto.MetricFamily) int { return cmp.Compare(a.GetName(), b.GetName()) })
}

// scrapeDashboard reads t's /metrics and puts t's org label on every series in place of
// any the dashboard gave.
func scrapeDashboard(ctx context.Context, t dashTarget) (map[string]*dto.MetricFamily, error) {
	sock, ok := unitnet.SocketPath(t.reach)
	if !ok {
		return nil, fmt.Errorf("the dashboard is at %q, not a unix: URL", t.reach)
	}
	ctx, cancel := context.WithTimeout(ctx, dashScrapeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://dashboard/metrics", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	resp, err := unitnet.HTTPClient(sock, dashScrapeTimeout).Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics answered %s", resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, dashScrapeMax+1))
	if err != nil {
		return nil, err
	}
	if len(body) > dashScrapeMax {
		return nil, fmt.Errorf("/metrics is larger than %d bytes", dashScrapeMax)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("/metrics is not the text format: %w", err)
	}
	series := 0
	for _, mf := range families {
		series += len(mf.Metric)
		for _, m := range mf.Metric {
			m.Label = slices.DeleteFunc(m.Label, func(l *dto.LabelPair) bool { return l.GetName() == "org" })
			m.Label = append(m.Label, orgLabel(t.org))
			slices.SortFunc(m.Label, func(a, b *dto.LabelPair) int { return cmp.Compare(a.GetName(), b.GetName()) })
		}
	}
	if series > dashScrapeSeries {
		return nil, fmt.Errorf("/metrics has %d series, more than %d", series, dashScrapeSeries)
	}
	return families, nil
}

func orgLabel(org string) *dto.LabelPair { return &dto.LabelPair{Name: new("org"), Value: new(org)} }
