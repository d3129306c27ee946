package web

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"hermeshost/assertion"
	"hermeshost/chat"
	"hermeshost/control"
	"hermeshost/handlers"
	"hermeshost/orghome"
	"hermeshost/service"
)

// DashboardConfig is what one org's dashboard holds (DESIGN section 14): that org's home,
// its control-API client and gateway key, and the key that verifies the launcher's
// assertions for it. No database credential, no other org's anything, no operator cookie.
type DashboardConfig struct {
	Org string
	// Home is the org's HERMES_HOME, opened by orghome.OpenHome for Org.
	Home *orghome.Home
	// Bundled is the image's bundled skills (orghome.ReadBundled); nil for none.
	Bundled *orghome.Bundled
	// SkillsMax is SKILLS_MAX_AUTHORED, shown beside the skills (0: not shown).
	SkillsMax int
	// AssertionKey is the org's hex verification key (DASHBOARD_ASSERTION_KEY).
	AssertionKey service.Secret
	// Control is the control API with the org's key (CONTROL_URL, CONTROL_KEY).
	Control *control.Client
	// GatewayURL and GatewayKey reach the model gateway as the org (the chat's, later);
	// the overview shows whether it answers /v1/models with the key.
	GatewayURL string
	GatewayKey service.Secret
	// Prefix is the path every page is served under, as the launcher proxies it:
	// /orgs/<org> when empty. Plain segments only (letters, digits, - . _ ~), no trailing /.
	Prefix string
	// HTTPClient makes the gateway's calls (nil: http.DefaultClient); every call is bounded
	// by SourceTimeout anyway.
	HTTPClient *http.Client
	// SourceTimeout bounds each call the overview makes to the control API or the gateway
	// (3s when zero).
	SourceTimeout time.Duration
	// Now is the clock assertions are checked against (nil: time.Now).
	Now func() time.Time
	// Chat runs the chat's turns on Home (nil: the chat pages say chat is off). The caller
	// made it and closes it, after the server has stopped.
	Chat *chat.Runner
}

var prefixPattern = regexp.MustCompile(`^(/[A-Za-z0-9._~-]+)+$`)

// NewDashboard builds one org's dashboard on ops' router: /healthz (with a probe of the
// home) and /metrics at the root, and under the prefix the static files and the pages,
// each of which needs the launcher's assertion for this org.
//
//	<prefix>/             overview: identity, jobs, lease holders, the gateway
//	<prefix>/sessions     the org's Hermes sessions (?q= search, ?after= next page)
//	<prefix>/sessions/{id} one session's transcript (?system=1 shows the system prompt)
//	<prefix>/memory       MEMORY.md and USER.md, read-only
//	<prefix>/skills       authored and bundled skills
//	<prefix>/jobs         the org's jobs from the control API (?cursor= next page)
//	<prefix>/jobs/{id}    one job: outcome, progress, newest events
//	<prefix>/events       the live updates of the jobs pages (SSE); .../refresh reloads a page
//	<prefix>/subagents    running and finished subagents; POST .../{id}/cancel and
//	                      .../{id}/messages (body) act through the control API as the operator
//	<prefix>/leases       the org's home: and session: leases, their events (?confirm=<key>
//	                      asks a reason); POST .../force-release (key, reason), audited;
//	                      GET .../events streams the table as leases change (SSE)
//	<prefix>/chat         the chat's form; POST starts a turn (session, message)
//	<prefix>/chat/turns/{turn} one turn: queued, running, its rows and answer; GET
//	                      .../events streams it as it changes (SSE); POST .../stop ends it
//	                      on the server
func NewDashboard(ops *service.Ops, cfg DashboardConfig) (http.Handler, error) {
	if err := orghome.ValidID(cfg.Org); err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	switch {
	case cfg.Home == nil:
		return nil, errors.New("dashboard: no home")
	case cfg.Home.ID != cfg.Org:
		return nil, fmt.Errorf("dashboard of org %s: the home opened is org %s's", cfg.Org, cfg.Home.ID)
	case cfg.Control == nil:
		return nil, errors.New("dashboard: no control API client")
	case cfg.GatewayURL == "":
		return nil, errors.New("dashboard: no gateway URL")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "/orgs/" + cfg.Org
	}
	if !prefixPattern.MatchString(cfg.Prefix) {
		return nil, fmt.Errorf("dashboard: prefix %q is not a path of plain segments without a trailing slash", cfg.Prefix)
	}
	if cfg.SourceTimeout == 0 {
		cfg.SourceTimeout = 3 * time.Second
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = http.DefaultClient
	}
	verifier, err := assertion.NewVerifier(cfg.Org, cfg.AssertionKey.Reveal(), cfg.Now)
	if err != nil {
		return nil, err
	}
	pages := handlers.Pages{Log: ops.Log, Prefix: cfg.Prefix}
	h := &handlers.Dashboard{
		Pages: pages, Org: cfg.Org, Home: cfg.Home, Bundled: cfg.Bundled, SkillsMax: cfg.SkillsMax,
		Control: cfg.Control, SourceTimeout: cfg.SourceTimeout,
		GatewayModels: func(ctx context.Context) ([]string, error) {
			return gatewayModels(ctx, cfg.HTTPClient, cfg.GatewayURL, cfg.GatewayKey)
		},
	}
	chatH := &handlers.Chat{Dashboard: h, Runner: cfg.Chat}
	live := newLiveFeed(jobEvents(cfg.Control), h.LiveJobs, ops.Log, ops.Registry)
	leaseLive := newLiveFeed(leaseChanges(cfg.Control), h.LiveLeases, ops.Log, ops.Registry)
	ops.Health.Probe("home", func(context.Context) error {
		_, err := cfg.Home.Stat(".")
		return err
	})

	p := cfg.Prefix
	r := ops.Router() // /healthz and /metrics come first; the pages are under the prefix
	r.NotFound(notFound(pages))
	r.Group(func(r chi.Router) {
		r.Use(SecurityHeaders, Recoverer(pages))
		// The launcher serves these itself, from the same files; served here too for a
		// dashboard reached directly (its tests).
		MountStatic(r, p)
		// Browsers ask for it on every site, at the root, where the launcher answers the same.
		r.Get("/favicon.ico", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
		r.Group(func(r chi.Router) {
			r.Use(requireAssertion(verifier, pages))
			r.Get(p, func(w http.ResponseWriter, r *http.Request) { handlers.Redirect(w, r, p+"/") })
			r.Get(p+"/", h.Overview)
			r.Get(p+"/sessions", h.HermesSessions)
			r.Get(p+"/sessions/{id}", h.HermesTranscript)
			r.Get(p+"/memory", h.Memory)
			r.Get(p+"/skills", h.Skills)
			r.With(live.mark).Get(p+"/jobs", h.Jobs)
			r.With(live.mark).Get(p+"/jobs/{id}", h.Job)
			r.Get(p+"/events", live.ServeHTTP)
			r.Get(p+"/events/refresh", liveRefresh)
			r.With(live.mark).Get(p+"/subagents", h.Subagents)
			r.Post(p+"/subagents/{id}/cancel", h.SubagentCancel)
			r.Post(p+"/subagents/{id}/messages", h.SubagentSend)
			r.With(leaseLive.mark).Get(p+"/leases", h.Leases)
			r.Get(p+"/leases/events", leaseLive.ServeHTTP)
			r.Post(p+"/leases/force-release", h.LeaseForceRelease)
			r.Get(p+"/chat", chatH.ChatPage)
			r.Post(p+"/chat", chatH.ChatSend)
			r.Get(p+"/chat/turns/{turn}", chatH.ChatTurn)
			r.Get(p+"/chat/turns/{turn}/events", chatTurnEvents(chatH))
			r.Post(p+"/chat/turns/{turn}/stop", chatH.ChatStop)
		})
	})
	return r, nil
}

// requireAssertion lets a request through only with the launcher's assertion for this
// org, and puts the operator it names in the context. Without one, or with one that is
// forged, expired or malformed, the answer is 401; one for another org is 403. Either way
// the error page says only that, and the refusal is logged with its reason (never the
// assertion).
func requireAssertion(v *assertion.Verifier, pages handlers.Pages) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			claims, err := v.Verify(r.Header.Get(assertion.Header))
			if err == nil {
				next.ServeHTTP(w, r.WithContext(handlers.WithAssertedOperator(r.Context(), claims.Operator)))
				return
			}
			pages.Log.Warn("dashboard: request refused", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr, "reason", err.Error())
			if errors.Is(err, assertion.ErrWrongOrg) {
				pages.Error(w, r, http.StatusForbidden, "This request was vouched for another organization's dashboard, not this one.")
				return
			}
			pages.Error(w, r, http.StatusUnauthorized, "This dashboard is reached only through the launcher: open the organization from the launcher's list.")
		})
	}
}

// maxModelList bounds what is read of the gateway's model list.
const maxModelList = 4 << 20

// gatewayModels asks the gateway's /v1/models with the org's key, as the dashboard's chat
// will reach it, and returns the ids served. The key is never in an error.
func gatewayModels(ctx context.Context, hc *http.Client, base string, key service.Secret) ([]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(base, "/")+"/v1/models", nil)
	if err != nil {
		return nil, fmt.Errorf("gateway URL: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+key.Reveal())
	resp, err := hc.Do(req)
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err // the URL is said once, below
		}
		return nil, fmt.Errorf("%s is unreachable: %w", redactedURL(base), err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxModelList))
	if err != nil {
		return nil, fmt.Errorf("read the model list: %w", err)
	}
	switch {
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		return nil, fmt.Errorf("it refused this organization's key (%d)", resp.StatusCode)
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("/v1/models answered %d", resp.StatusCode)
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, errors.New("/v1/models answered with something other than a model list")
	}
	ids := make([]string, 0, len(list.Data))
	for _, m := range list.Data {
		ids = append(ids, m.ID)
	}
	return ids, nil
}

// redactedURL is u without credentials, query or fragment, for a message.
func redactedURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "the gateway URL"
	}
	p.User, p.RawQuery, p.Fragment = nil, "", ""
	return p.String()
}
