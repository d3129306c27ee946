package deploy

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"hermeshost/chat"
	"hermeshost/control"
	"hermeshost/dashboards"
	"hermeshost/dispatch"
	"hermeshost/dispatch/runtime"
	"hermeshost/gateway"
	"hermeshost/internal/egress"
	"hermeshost/lease"
	"hermeshost/pg"
	"hermeshost/service"
	"hermeshost/subagent"
)

// alertRules is deploy/alerts.yml as Prometheus reads it.
type alertRules struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// synthetic are series Prometheus makes itself for every scrape target.
var synthetic = map[string]bool{"up": true, "scrape_duration_seconds": true}

// targetLabels are labels Prometheus adds to every scraped series.
var targetLabels = map[string]bool{"job": true, "instance": true}

// TestAlertRulesNameOnlyRegisteredMetrics reads deploy/alerts.yml and holds every rule to
// the metrics the processes register: each metric an expression selects must be registered
// on the registry of the gateway, the dispatcher or the launcher, built as those processes
// build it, and each label it matches on must be one of that metric's labels.
func TestAlertRulesNameOnlyRegisteredMetrics(t *testing.T) {
	rules := readAlertRules(t)
	procs := processRegistries(t)

	var count int
	seen := map[string]bool{}
	for _, g := range rules.Groups {
		if g.Name == "" || len(g.Rules) == 0 {
			t.Errorf("group %q: a group needs a name and rules", g.Name)
		}
		for _, r := range g.Rules {
			count++
			where := fmt.Sprintf("group %s, alert %s", g.Name, r.Alert)
			if !regexp.MustCompile(`^Hermes[A-Z][A-Za-z]+$`).MatchString(r.Alert) || seen[r.Alert] {
				t.Errorf("%s: alert names are unique, CamelCase and start with Hermes", where)
			}
			seen[r.Alert] = true
			if s := r.Labels["severity"]; s != "critical" && s != "warning" && s != "info" {
				t.Errorf("%s: severity %q is not critical, warning or info", where, s)
			}
			for _, a := range []string{"summary", "description"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					t.Errorf("%s: no %s annotation", where, a)
				}
			}
			if r.For != "" && !regexp.MustCompile(`^([0-9]+(ms|s|m|h|d|w|y))+$`).MatchString(r.For) {
				t.Errorf("%s: for %q is not a Prometheus duration", where, r.For)
			}
			sels, err := selectors(r.Expr)
			if err != nil {
				t.Errorf("%s: %v", where, err)
				continue
			}
			if len(sels) == 0 {
				t.Errorf("%s: expression %q selects no metric", where, r.Expr)
			}
			for _, s := range sels {
				if synthetic[s.name] {
					continue
				}
				if err := procs.check(s); err != nil {
					t.Errorf("%s: %v", where, err)
				}
			}
		}
	}
	// The metrics the issue asks alerts for are all covered.
	for _, want := range []string{"hermes_lease_events_total", "hermes_dispatch_claims_total", "hermes_dispatch_outcomes_total",
		"gateway_token_refreshes_total", "gateway_auth_persist_failures_total", "hermes_runtime_execs_total",
		"hermes_dispatch_gate_closed_total", "hermes_file_write_errors_total", "hermes_dispatch_worker_file_write_errors_total", "up"} {
		if !strings.Contains(readFile(t, "alerts.yml"), want) {
			t.Errorf("no rule names %s", want)
		}
	}
	if count < 10 {
		t.Errorf("only %d rules", count)
	}
}

// TestAlertRuleCheckCatchesAMisnamedMetric is the check above failing where it must: a
// metric no process registers, a label the metric does not have, and a broken expression.
func TestAlertRuleCheckCatchesAMisnamedMetric(t *testing.T) {
	procs := processRegistries(t)
	for expr, want := range map[string]string{
		`increase(hermes_dispatch_claim_total[5m]) > 0`:                            "hermes_dispatch_claim_total is registered by no process",
		`increase(hermes_dispatch_claims_total{type="reclaim"}[5m]) > 0`:           `has no label "type"`,
		`sum by (instance) (rate(gateway_auth_persist_failures_total[5m])`:         "unbalanced",
		`max(gateway_auth_persist_pending{instance="a"}) == 1`:                     "",
		`histogram_quantile(0.99, rate(hermes_dispatch_cycle_seconds_bucket[5m]))`: "",
	} {
		sels, err := selectors(expr)
		if err == nil {
			for _, s := range sels {
				if err = procs.check(s); err != nil {
					break
				}
			}
		}
		switch {
		case want == "" && err != nil:
			t.Errorf("%s: %v", expr, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("%s: got %v, want an error saying %q", expr, err, want)
		}
	}
}

func readAlertRules(t *testing.T) alertRules {
	t.Helper()
	dec := yaml.NewDecoder(bytes.NewReader([]byte(readFile(t, "alerts.yml"))))
	dec.KnownFields(true)
	var rules alertRules
	if err := dec.Decode(&rules); err != nil {
		t.Fatalf("alerts.yml: %v", err)
	}
	return rules
}

func readFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// selector is one metric an expression selects and the labels it matches on.
type selector struct {
	name   string
	labels []string
}

// promFuncs are the PromQL words followed by a parenthesis that are not grouping clauses;
// anything else followed by "(" is an error, so a typo in a function is not taken for a
// metric.
var promFuncs = regexp.MustCompile(`^(sum|min|max|avg|count|stddev|stdvar|topk|bottomk|quantile|count_values|group|` +
	`rate|irate|increase|delta|idelta|deriv|predict_linear|resets|changes|abs|absent|absent_over_time|ceil|floor|round|` +
	`clamp|clamp_max|clamp_min|exp|ln|log2|log10|sqrt|sgn|timestamp|time|vector|scalar|sort|sort_desc|label_replace|label_join|` +
	`histogram_quantile|[a-z]+_over_time)$`)

var promKeywords = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true}

// selectors lists the metric selectors of a PromQL expression: every identifier that is
// not a function, keyword, grouping clause or label name, with the labels of its matcher.
func selectors(expr string) ([]selector, error) {
	var out []selector
	depth := 0
	r := []rune(expr)
	ident := func(i int) int {
		for i < len(r) && (r[i] == '_' || r[i] == ':' || unicode.IsLetter(r[i]) || unicode.IsDigit(r[i])) {
			i++
		}
		return i
	}
	skipSpace := func(i int) int {
		for i < len(r) && unicode.IsSpace(r[i]) {
			i++
		}
		return i
	}
	skipString := func(i int) (int, error) {
		q := r[i]
		for i++; i < len(r); i++ {
			if r[i] == '\\' {
				i++
				continue
			}
			if r[i] == q {
				return i + 1, nil
			}
		}
		return 0, fmt.Errorf("expression %q: unterminated string", expr)
	}
	for i := 0; i < len(r); {
		c := r[i]
		switch {
		case unicode.IsSpace(c):
			i++
		case c == '"' || c == '\'' || c == '`':
			var err error
			if i, err = skipString(i); err != nil {
				return nil, err
			}
		case c == '(':
			depth++
			i++
		case c == ')':
			depth--
			if depth < 0 {
				return nil, fmt.Errorf("expression %q: unbalanced parentheses", expr)
			}
			i++
		case c == '[':
			end := strings.IndexRune(string(r[i:]), ']')
			if end < 0 {
				return nil, fmt.Errorf("expression %q: unbalanced brackets", expr)
			}
			i += len([]rune(string(r[i:])[:end])) + 1
		case c == '{':
			return nil, fmt.Errorf("expression %q: a matcher without a metric name", expr)
		case unicode.IsDigit(c) || c == '.':
			for i < len(r) && (unicode.IsDigit(r[i]) || r[i] == '.' || r[i] == 'e') {
				i++
			}
		case c == '_' || c == ':' || unicode.IsLetter(c):
			end := ident(i)
			word := string(r[i:end])
			next := skipSpace(end)
			switch {
			case word == "by" || word == "without" || word == "on" || word == "ignoring" || word == "group_left" || word == "group_right":
				if next < len(r) && r[next] == '(' {
					close := strings.IndexRune(string(r[next:]), ')')
					if close < 0 {
						return nil, fmt.Errorf("expression %q: unbalanced parentheses", expr)
					}
					next += len([]rune(string(r[next:])[:close])) + 1
				}
				i = next
			case next < len(r) && r[next] == '(':
				if !promFuncs.MatchString(word) {
					return nil, fmt.Errorf("expression %q: %s is not a PromQL function", expr, word)
				}
				i = end
			case promKeywords[word]:
				i = end
			case promFuncs.MatchString(word) && (strings.HasPrefix(string(r[next:]), "by") || strings.HasPrefix(string(r[next:]), "without")):
				i = end // an aggregation with its grouping clause first: sum by (x) (...)
			default:
				s := selector{name: word}
				i = next
				if i < len(r) && r[i] == '{' {
					close := strings.IndexRune(string(r[i:]), '}')
					if close < 0 {
						return nil, fmt.Errorf("expression %q: unbalanced braces", expr)
					}
					body := string(r[i+1 : i+len([]rune(string(r[i:])[:close]))])
					for _, m := range regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*")`).FindAllStringSubmatch(body, -1) {
						s.labels = append(s.labels, m[1])
					}
					i += len([]rune(string(r[i:])[:close])) + 1
				}
				out = append(out, s)
			}
		default:
			i++
		}
	}
	if depth != 0 {
		return nil, fmt.Errorf("expression %q: unbalanced parentheses", expr)
	}
	return out, nil
}

// registries are the Prometheus registries of the processes Prometheus scrapes, with the
// descriptors of what was registered on them where the test could see it.
type registries struct {
	regs   map[string]*prometheus.Registry
	labels map[string][]string // metric name to its variable labels, where known
}

// check says whether some process registers s's metric (a histogram's _bucket, _sum and
// _count series count as the histogram), and whether it has the labels s matches on.
func (p registries) check(s selector) error {
	name := s.name
	registered := func(n string) bool {
		for _, reg := range p.regs {
			if isRegistered(reg, n) {
				return true
			}
		}
		return false
	}
	if !registered(name) {
		base := ""
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(name, suffix); ok && registered(b) {
				base = b
			}
		}
		if base == "" {
			return fmt.Errorf("metric %s is registered by no process (gateway, dispatcher, launcher, dashboards)", name)
		}
		name = base
	}
	known, ok := p.labels[name]
	if !ok {
		return nil
	}
	for _, l := range s.labels {
		if !targetLabels[l] && !slices.Contains(known, l) && !(l == "le" && s.name != name) {
			return fmt.Errorf("metric %s has no label %q (it has %v)", name, l, known)
		}
	}
	return nil
}

// isRegistered says whether reg holds a metric named name: registering a probe of that
// name with another help string fails exactly when one is there. The probe is removed.
func isRegistered(reg *prometheus.Registry, name string) bool {
	probe := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: "deploy test probe"}, []string{"deploy_test_probe"})
	if err := reg.Register(probe); err != nil {
		return true
	}
	reg.Unregister(probe)
	return false
}

// recorder registers on a registry and keeps the descriptors registered through it.
type recorder struct {
	reg    *prometheus.Registry
	labels map[string][]string
}

func (r recorder) Register(c prometheus.Collector) error {
	if err := r.reg.Register(c); err != nil {
		return err
	}
	ch := make(chan *prometheus.Desc, 16)
	go func() { c.Describe(ch); close(ch) }()
	// Const labels (a pool's name) read as pool="main"; variable ones by name alone.
	descRE := regexp.MustCompile(`fqName: "([^"]+)".*constLabels: \{([^}]*)\}, variableLabels: \{([^}]*)\}\}$`)
	for d := range ch {
		m := descRE.FindStringSubmatch(d.String())
		if m == nil {
			continue
		}
		var labels []string
		for _, l := range strings.Split(m[2]+","+m[3], ",") {
			if name, _, _ := strings.Cut(l, "="); name != "" && !slices.Contains(labels, name) {
				labels = append(labels, name)
			}
		}
		r.labels[m[1]] = labels
	}
	return nil
}

func (r recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

func (r recorder) Unregister(c prometheus.Collector) bool { return r.reg.Unregister(c) }

// processRegistries builds the registries of the gateway, the dispatcher and the launcher
// from the same constructors and options their subcommands use (cmd/hermes-host gateway.go,
// dispatcher.go, launcher.go), on a database pool that never connects.
func processRegistries(t *testing.T) registries {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	p := registries{regs: map[string]*prometheus.Registry{}, labels: map[string][]string{}}
	ctx := context.Background()

	// Every server: service.NewOps, whose request metrics are these.
	service.NewHTTPMetrics(recorder{reg: prometheus.NewRegistry(), labels: p.labels})

	// The gateway with its OAuth login.
	gw := service.NewOps(log)
	auth := filepath.Join(t.TempDir(), "auth.json")
	if err := gateway.SaveLogin(auth, gateway.Credentials{Version: 1, Identity: "deploy-test", RefreshToken: "r", UpdatedAt: time.Now()}, false); err != nil {
		t.Fatal(err)
	}
	login, err := gateway.OpenLogin(gateway.LoginOptions{Path: auth, OAuth: gateway.OAuthConfig{TokenURL: "http://127.0.0.1:1/token", ClientID: "c"},
		Log: log, Health: gw.Health, Registry: recorder{reg: gw.Registry, labels: p.labels}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { login.Close() })
	if _, err := gateway.New(gateway.Config{UpstreamURL: "http://127.0.0.1:1/v1", Secret: "deploy-test-secret", Login: login,
		OrgRPS: 1, OrgBurst: 2, OrgConcurrency: 1, MaxRequestBytes: 1 << 20, Ops: gw}); err != nil {
		t.Fatal(err)
	}
	p.regs["gateway"] = gw.Registry

	// The dispatcher.
	pool, err := pgxpool.New(ctx, "postgres://deploy-test@127.0.0.1:1/none?search_path=hermes_host&sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	d := service.NewOps(log)
	rec := recorder{reg: d.Registry, labels: p.labels}
	if err := pg.RegisterPoolMetrics(rec, pg.MainPool, pool); err != nil {
		t.Fatal(err)
	}
	if err := pg.RegisterPoolMetrics(rec, pg.LeasePool, pool); err != nil {
		t.Fatal(err)
	}
	leases := lease.New(pool, lease.Options{Log: log, Registerer: rec, KeepPool: pool})
	t.Cleanup(leases.Close)
	agentLeases := lease.New(pool, lease.Options{Log: log, Registerer: rec})
	t.Cleanup(agentLeases.Close)
	subagents := subagent.New(pool, subagent.Options{Log: log, Registerer: rec})
	t.Cleanup(subagents.Close)
	ctl, err := control.NewServer(control.Config{DB: pool, Leases: agentLeases, Subagents: subagents, Secret: "deploy-test-secret", Log: log, Registerer: rec})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ctl.Close)
	runtime.NewMetrics(rec)
	egress.New(egress.Config{Registerer: rec}) // with UNIT_EGRESS=public
	dash := dashboards.New(pool, dashboards.Options{Log: log, Registerer: rec})
	t.Cleanup(dash.Close)
	disp := dispatch.New(dispatch.Config{Instance: "deploy-test", DB: pool, Leases: leases, Subagents: subagents, Log: log, Registerer: rec, Dashboards: dash})
	t.Cleanup(disp.Close)
	p.regs["dispatcher"] = d.Registry

	// The launcher holds only its server's metrics.
	p.regs["launcher"] = service.NewOps(log).Registry

	// A dashboard's, which its dispatcher serves at /metrics/dashboards with an org label.
	dashOps := service.NewOps(log)
	chat.NewSweepMetrics(recorder{reg: dashOps.Registry, labels: p.labels})
	p.regs["dashboards"] = dashOps.Registry
	return p
}
