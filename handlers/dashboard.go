package handlers

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"hermeshost/control"
	"hermeshost/orghome"
	"hermeshost/templates"
)

// Dashboard is one org's dashboard pages: overview, Hermes sessions and transcripts,
// memory, skills. It reads only that org's home (state.db, SOUL.md, memories/, skills/)
// and reaches durable state through the control API with the org's own key, so there is
// no other org's anything to show.
type Dashboard struct {
	Pages
	Org     string
	Home    *orghome.Home
	Bundled *orghome.Bundled // the image's bundled skills; nil for none
	// SkillsMax is SKILLS_MAX_AUTHORED, shown beside the skills; 0 when not known.
	SkillsMax int
	Control   *control.Client
	// GatewayModels asks the model gateway for /v1/models with the org's key (what the
	// chat will use), and returns the model ids it serves.
	GatewayModels func(context.Context) ([]string, error)
	// SourceTimeout bounds each call the overview makes (control API, gateway), so one
	// that hangs leaves the page to say so rather than hang with it.
	SourceTimeout time.Duration
}

type assertedKey struct{}

// WithAssertedOperator is ctx carrying the operator the launcher's assertion names (set by
// the web layer's assertion check, the only thing a dashboard trusts).
func WithAssertedOperator(ctx context.Context, operator string) context.Context {
	return context.WithValue(ctx, assertedKey{}, operator)
}

// AssertedOperator is the operator of a request that passed the assertion check.
func AssertedOperator(ctx context.Context) string {
	op, _ := ctx.Value(assertedKey{}).(string)
	return op
}

func (h *Dashboard) frame(ctx context.Context, active string) templates.DashboardFrame {
	return templates.DashboardFrame{Paths: h.Paths(), Org: h.Org, Operator: AssertedOperator(ctx), Active: active}
}

// shownTime is how the dashboard writes a time; "—" for none.
func shownTime(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05") + " UTC"
}

// shownCount writes n with thousands separators, as counters are read.
func shownCount(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := n < 0
	if neg {
		s = s[1:]
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		return "-" + s
	}
	return s
}

func shownCost(usd *float64) string {
	if usd == nil {
		return "—"
	}
	return fmt.Sprintf("$%.4f", *usd)
}
