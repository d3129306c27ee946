package templates

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/PuerkitoBio/goquery"
	"github.com/a-h/templ"
)

const hostile = `<script>alert(1)</script>" hx-get="/evil" hx-trigger="load" javascript:alert(2)`

// render renders c into goquery, failing on any markup or htmx attribute that came from
// text rather than from the template.
func render(t *testing.T, c templ.Component) *goquery.Document {
	t.Helper()
	var buf bytes.Buffer
	if err := c.Render(context.Background(), &buf); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "<script>alert") {
		t.Fatalf("text reached the markup unescaped:\n%s", buf.String())
	}
	d, err := goquery.NewDocumentFromReader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	d.Find("*").Each(func(_ int, s *goquery.Selection) {
		for _, a := range s.Nodes[0].Attr {
			if strings.HasPrefix(a.Key, "hx-") && (strings.Contains(a.Val, "evil") || strings.Contains(a.Val, "load")) {
				t.Errorf("<%s %s=%q> came from text", goquery.NodeName(s), a.Key, a.Val)
			}
		}
	})
	return d
}

func byTestID(d *goquery.Document, id string) *goquery.Selection {
	return d.Find(`[data-testid="` + id + `"]`)
}

var frame = DashboardFrame{Paths: Paths{Prefix: "/orgs/acme"}, Org: "acme", Operator: "ada", Active: NavSessions}

func TestTheDashboardFrameLinksUnderItsPrefixAndMarksThePageOpen(t *testing.T) {
	d := render(t, DashboardMemory(MemoryView{Frame: DashboardFrame{Paths: Paths{Prefix: "/p/acme"}, Org: "acme", Operator: hostile, Active: NavMemory}}))
	for id, href := range map[string]string{"nav-overview": "/p/acme/", "nav-sessions": "/p/acme/sessions", "nav-memory": "/p/acme/memory", "nav-skills": "/p/acme/skills"} {
		if got, _ := byTestID(d, id).Attr("href"); got != href {
			t.Errorf("%s links %q, want %q", id, got, href)
		}
	}
	if cur, _ := byTestID(d, "nav-memory").Attr("aria-current"); cur != "page" {
		t.Error("the open page is not marked")
	}
	if _, marked := byTestID(d, "nav-skills").Attr("aria-current"); marked {
		t.Error("another page is marked open")
	}
	if href, _ := d.Find(`link[rel="stylesheet"]`).Attr("href"); href != "/p/acme/static/app.css" {
		t.Errorf("stylesheet %q", href)
	}
	if src, _ := d.Find("script").Attr("src"); src != "/p/acme/static/vendor/htmx.min.js" {
		t.Errorf("htmx %q", src)
	}
	if got := byTestID(d, "operator").Text(); got != hostile {
		t.Errorf("operator %q", got)
	}
}

func TestTheSearchKeepsItsTextOutOfHtmxAttributes(t *testing.T) {
	d := render(t, DashboardHermesSessions(HermesSessionsView{Frame: frame, Query: hostile}))
	form := byTestID(d, "sessions-search")
	if got, _ := form.Attr("hx-get"); got != "/orgs/acme/sessions" {
		t.Errorf("hx-get %q", got)
	}
	if got, _ := form.Find(`input[name="q"]`).Attr("value"); got != hostile {
		t.Errorf("the search box holds %q", got)
	}
	if byTestID(d, "sessions-no-match").Length() != 1 {
		t.Error("a search without hits does not say so")
	}
}

func TestTheSessionListsEmptyStates(t *testing.T) {
	for id, v := range map[string]HermesSessionsView{
		"sessions-no-state":    {NoState: true},
		"sessions-busy":        {Busy: true},
		"sessions-interrupted": {Interrupted: true},
		"sessions-none":        {},
		"sessions-no-match":    {Query: "x"},
	} {
		d := render(t, HermesSessionList(v))
		if byTestID(d, id).Length() != 1 || byTestID(d, "hermes-session").Length() != 0 {
			t.Errorf("%s is not the state shown", id)
		}
		if d.Find("header, nav").Length() != 0 {
			t.Errorf("%s: the list fragment holds a whole page", id)
		}
	}
}

func TestSessionRowsLinkByEscapedIDAndShowTheirKind(t *testing.T) {
	p := Paths{Prefix: "/orgs/acme"}
	v := HermesSessionsView{Frame: frame, Groups: []HermesSessionGroup{{
		Session:  HermesSessionRow{ID: hostile, Link: p.Page("/sessions/" + "%3Cscript%3E"), Title: hostile, Tokens: "—", TokensIn: "1,000", TokensOut: "20", Cost: "—"},
		Children: []HermesSessionRow{{ID: "child", Link: p.Page("/sessions/child"), Kind: "subagent", Depth: 1}},
	}}, Next: p.PageWith("/sessions", map[string][]string{"q": {hostile}, "after": {"abc"}})}
	d := render(t, DashboardHermesSessions(v))
	rows := byTestID(d, "hermes-session")
	if rows.Length() != 2 {
		t.Fatalf("%d rows", rows.Length())
	}
	if got := rows.First().Find(`[data-testid="session-link"]`).Text(); strings.TrimSpace(got) != hostile {
		t.Errorf("title %q", got)
	}
	if got := rows.Eq(1).Find(`[data-testid="session-kind"]`).Text(); got != "subagent" || !rows.Eq(1).HasClass("depth-1") {
		t.Errorf("child row: kind %q", got)
	}
	if got := rows.First().Find(`[data-testid="session-tokens"]`).Text(); got != "1,000 / 20" {
		t.Errorf("tokens %q", got)
	}
	next, _ := byTestID(d, "sessions-next").Attr("href")
	if !strings.HasPrefix(next, "/orgs/acme/sessions?") || strings.ContainsAny(next, `<>" `) {
		t.Errorf("next page link %q", next)
	}
}

func TestATranscriptFoldsToolsAndLongContentAndHidesTheSystemPromptUnlessAsked(t *testing.T) {
	v := TranscriptView{
		Frame: frame, Session: HermesSessionRow{ID: "s1", Title: hostile}, SystemChars: 12, SystemPrompt: "",
		ShowSystemLink: "/orgs/acme/sessions/s1?system=1",
		Messages: []TranscriptMessage{
			{Role: "user", Content: hostile},
			{Role: "assistant", ToolCalls: []ToolCallView{{Name: hostile, Arguments: hostile, Chars: 3}}},
			{Role: "tool", ToolName: "terminal", Content: hostile, Chars: 5},
			{Role: "assistant", Content: "very long", Long: true, Preview: "very", Chars: 9},
		},
		Omitted: 2,
	}
	d := render(t, DashboardTranscript(v))
	if byTestID(d, "system-prompt").Length() != 0 {
		t.Error("the system prompt is on the page unasked")
	}
	if href, _ := byTestID(d, "show-system").Attr("href"); href != "/orgs/acme/sessions/s1?system=1" {
		t.Errorf("show link %q", href)
	}
	if got := byTestID(d, "message").Length(); got != 4 {
		t.Fatalf("%d messages", got)
	}
	for _, id := range []string{"tool-call", "tool-result", "long-content"} {
		s := byTestID(d, id)
		if goquery.NodeName(s) != "details" || s.Is("[open]") {
			t.Errorf("%s is not folded", id)
		}
	}
	if got := byTestID(d, "tool-call-name").Text(); got != hostile {
		t.Errorf("tool name %q", got)
	}
	if got := byTestID(d, "tool-call-arguments").Text(); got != hostile {
		t.Errorf("arguments %q", got)
	}
	if got := byTestID(d, "transcript-omitted").Text(); !strings.HasPrefix(got, "2 rows") {
		t.Errorf("omitted %q", got)
	}

	v.ShowSystem, v.SystemPrompt = true, hostile
	d = render(t, DashboardTranscript(v))
	if s := byTestID(d, "system-prompt"); s.Is("[open]") || s.Find("pre").Text() != hostile {
		t.Errorf("the system prompt asked for: %q", s.Text())
	}
}

func TestTheOverviewShowsEachSourcesErrorInItsPlace(t *testing.T) {
	d := render(t, DashboardOverview(OverviewView{
		Frame:    frame,
		Identity: IdentityView{Exists: true, Version: 1, CurrentVersion: 1, Intact: true, Free: hostile},
		Jobs:     JobsView{Error: "connection refused"},
		Leases:   LeasesView{Error: "connection refused"},
		Gateway:  GatewayView{Error: "it refused this organization's key (401)"},
	}))
	for _, id := range []string{"jobs-error", "leases-error", "gateway-error"} {
		if byTestID(d, id).Length() != 1 {
			t.Errorf("no %s", id)
		}
	}
	if got := byTestID(d, "identity-free").Text(); got != hostile {
		t.Errorf("free section %q", got)
	}
	d = render(t, DashboardOverview(OverviewView{
		Frame:  frame,
		Jobs:   JobsView{Current: []JobRow{{ID: hostile, Status: "RUNNING"}}},
		Leases: LeasesView{Rows: []LeaseRow{{Key: "session:" + hostile, Holder: hostile}}},
	}))
	if got := byTestID(d, "jobs-current").Find("code").Text(); got != hostile {
		t.Errorf("job id %q", got)
	}
	if got := byTestID(d, "lease-holder").Text(); got != hostile {
		t.Errorf("lease holder %q", got)
	}
	if byTestID(d, "jobs-recent-none").Length() != 1 || byTestID(d, "identity-none").Length() != 1 {
		t.Error("empty parts do not say so")
	}
}

func TestMemoryAndSkillsShowTheirTextAsText(t *testing.T) {
	d := render(t, DashboardMemory(MemoryView{Frame: frame, Files: []MemoryFileView{
		{Name: "MEMORY.md", Exists: true, Entries: []string{hostile}, Chars: 2300, Limit: 2200, Percent: 104, Over: true},
		{Name: "USER.md"},
	}}))
	if got := byTestID(d, "memory-entry").Text(); got != hostile {
		t.Errorf("entry %q", got)
	}
	if !byTestID(d, "memory-fill").HasClass("bad") {
		t.Error("an over-full file is not marked")
	}
	if v, _ := d.Find("meter").Attr("value"); v != "2200" {
		t.Errorf("meter value %q, want it capped at the limit", v)
	}
	if byTestID(d, "memory-none").Length() != 1 || byTestID(d, "memory-readonly").Length() != 1 {
		t.Error("the missing USER.md or the read-only note is not shown")
	}
	d = render(t, DashboardSkills(SkillsView{Frame: frame,
		Skills: []SkillRow{{Name: hostile, Description: hostile, Disabled: true, LastUsed: "—"}},
		Broken: []BrokenSkillRow{{Dir: hostile, Reason: hostile}}}))
	if got := byTestID(d, "skill-name").Text(); got != hostile {
		t.Errorf("skill name %q", got)
	}
	if got := strings.TrimSpace(byTestID(d, "skill-state").Text()); got != "disabled" {
		t.Errorf("state %q", got)
	}
	if got := byTestID(d, "skill-broken-reason").Text(); got != hostile {
		t.Errorf("broken reason %q", got)
	}
	if byTestID(render(t, DashboardSkills(SkillsView{Frame: frame, BundledDir: "/opt/hermes/skills"})), "skills-none").Length() != 1 {
		t.Error("no skills has no empty state")
	}
}

func TestTheLauncherLinksEachOrgToItsDashboard(t *testing.T) {
	d := render(t, Orgs(OrgsView{RefreshSeconds: 5, Rows: []OrgRow{
		{Org: "acme", Dashboard: DashboardHome("acme")},
		{Org: hostile},
	}}))
	if href, _ := byTestID(d, "open-acme").Attr("href"); href != "/orgs/acme/" {
		t.Errorf("acme's link %q", href)
	}
	if got := d.Find("a").Length(); got != 1 {
		t.Errorf("%d links: an org without a dashboard URL is linked", got)
	}
	if got, _ := byTestID(d, "orgs").Attr("hx-get"); got != "/orgs" {
		t.Errorf("the table reloads from %q", got)
	}
}

func TestTheErrorPageSaysWhatWentWrong(t *testing.T) {
	d := render(t, ErrorPage(ErrorView{Paths: Paths{Prefix: "/orgs/acme"}, Status: 404, Title: "Not Found", Message: hostile}))
	if got := byTestID(d, "error-status").Text(); got != "404 Not Found" {
		t.Errorf("status %q", got)
	}
	if got := byTestID(d, "error-message").Text(); got != hostile {
		t.Errorf("message %q", got)
	}
	if href, _ := d.Find(`link[rel="stylesheet"]`).Attr("href"); href != "/orgs/acme/static/app.css" {
		t.Errorf("stylesheet %q", href)
	}
}

func TestAJobShowsProgressOfAKnownTotalOrJustTheCount(t *testing.T) {
	f := DashboardFrame{Paths: Paths{Prefix: "/orgs/acme"}, Org: "acme", Active: NavJobs}
	d := render(t, DashboardJob(JobDetailView{Frame: f, Job: JobRow{ID: hostile, Error: hostile}, Reason: hostile, Outcome: "failed",
		Progress: &JobProgress{Persisted: 3, Total: 4, Percent: 75}, Events: []JobEventRow{{Kind: "progress", Data: hostile}}}))
	if v, _ := byTestID(d, "job-progress-bar").Attr("value"); v != "3" {
		t.Errorf("progress value %q", v)
	}
	if byTestID(d, "job-reason").Text() != hostile || byTestID(d, "job-event-data").Text() != hostile || byTestID(d, "job-id").Text() != hostile {
		t.Error("the job's text is not shown as text")
	}
	d = render(t, DashboardJob(JobDetailView{Frame: f, Progress: &JobProgress{Persisted: 2}}))
	if _, ok := byTestID(d, "job-progress-bar").Attr("max"); ok {
		t.Error("a bar with a max when the total is not known")
	}
	if !strings.Contains(byTestID(d, "job-progress-text").Text(), "2 categories persisted") || byTestID(d, "job-events-none").Length() != 1 {
		t.Errorf("no total: %q", byTestID(d, "job-progress-text").Text())
	}
	d = render(t, DashboardJobs(JobListView{Frame: f}))
	if byTestID(d, "jobs-none").Length() != 1 {
		t.Error("no empty state")
	}
}

func TestASubagentRowOffersCancelAndSendOnlyWhileRunningAndKeepsItsIDOutOfText(t *testing.T) {
	p := Paths{Prefix: "/orgs/acme"}
	d := render(t, inTable(SubagentRowFragment(p, SubagentRow{ID: "sub.1:a", Goal: hostile, Summary: hostile, Status: "running", Running: true, Live: true, Pending: 2})))
	for id, want := range map[string]string{"subagent-cancel": "/orgs/acme/subagents/sub.1:a/cancel", "subagent-send": "/orgs/acme/subagents/sub.1:a/messages"} {
		if got, _ := byTestID(d, id).Attr("hx-post"); got != want {
			t.Errorf("%s posts to %q, want %q", id, got, want)
		}
		if got, _ := byTestID(d, id).Attr("action"); got != want {
			t.Errorf("%s's form action %q", id, got)
		}
	}
	if byTestID(d, "subagent-goal").Text() != hostile || byTestID(d, "subagent-summary").Text() != hostile {
		t.Error("goal or summary not shown as text")
	}
	if got := byTestID(d, "subagent-send").Find(`input[name="body"]`).Length(); got != 1 {
		t.Error("no body field")
	}
	if got := p.SubagentHX("a/../b", "cancel"); got != "/orgs/acme/subagents/a%2F..%2Fb/cancel" {
		t.Errorf("an id with a slash makes %q", got)
	}
	d = render(t, inTable(SubagentRowFragment(p, SubagentRow{ID: "s2", Status: "done", Notice: hostile, Refused: true})))
	if byTestID(d, "subagent-cancel").Length() != 0 || byTestID(d, "subagent-send").Length() != 0 {
		t.Error("an ended subagent offers actions")
	}
	if byTestID(d, "subagent-notice").Text() != hostile {
		t.Error("the refusal is not shown as text")
	}
}

// inTable is a row fragment inside a table, where an HTML parser keeps a row.
func inTable(row templ.Component) templ.Component {
	return templ.ComponentFunc(func(ctx context.Context, w io.Writer) error {
		if _, err := io.WriteString(w, "<table>"); err != nil {
			return err
		}
		if err := row.Render(ctx, w); err != nil {
			return err
		}
		_, err := io.WriteString(w, "</table>")
		return err
	})
}

func TestTheLeasesConfirmationKeepsTheKeyAFormValueAndOffersReleaseOnlyForHeldLeases(t *testing.T) {
	f := DashboardFrame{Paths: Paths{Prefix: "/orgs/acme"}, Org: "acme", Active: NavLeases}
	d := render(t, DashboardLeases(LeasesPageView{Frame: f, Confirm: hostile, Notice: hostile, Refused: true, Leases: []LeaseDetailRow{
		{Key: "home:acme", Holder: "w1", Held: true, Epoch: 3, Confirm: f.Paths.Page("/leases?confirm=home%3Aacme"),
			Events: []LeaseEventRow{{Kind: "force_release", Holder: "w0", Actor: hostile, Reason: hostile}}},
		{Key: "session:s1", Epoch: 2},
	}}))
	if v, _ := byTestID(d, "force-release-form").Find(`input[name="key"]`).Attr("value"); v != hostile {
		t.Errorf("the key's form value %q", v)
	}
	if byTestID(d, "force-release-key").Text() != hostile || byTestID(d, "leases-notice").Text() != hostile ||
		byTestID(d, "lease-event-reason").Text() != hostile || byTestID(d, "lease-event-actor").Text() != hostile {
		t.Error("untrusted text not shown as text")
	}
	if n := byTestID(d, "lease-force-release").Length(); n != 1 {
		t.Errorf("%d Force release links for one held lease", n)
	}
	if got := byTestID(d, "nav-leases").AttrOr("aria-current", ""); got != "page" {
		t.Error("the leases page is not marked open")
	}
	d = render(t, DashboardLeases(LeasesPageView{Frame: f}))
	if byTestID(d, "leases-none").Length() != 1 || byTestID(d, "force-release-form").Length() != 0 {
		t.Error("the empty page")
	}
}
