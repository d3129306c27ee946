package web_test

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

func TestTheJobsPageListsTheOrgsJobsAndAJobsOutcomeProgressAndEvents(t *testing.T) {
	acme, _ := twoHomes(t, 0)
	d := newDash(t, dashOptions{home: acme})
	for _, j := range []struct{ org, id, typ, status, error string }{
		{"acme", "job-guidelines", "guidelines", "RUNNING", ""},
		{"acme", "job-failed", "product_ingest", "FAILED", hostile},
		{"globex", "job-globex", "product_ingest", "RUNNING", "globex's secret"},
	} {
		d.exec(`INSERT INTO mirror_jobs (job_id, org, type, status, attempt, error) VALUES ($1, $2, $3, $4, 2, NULLIF($5, ''))`,
			j.id, j.org, j.typ, j.status, j.error)
	}
	for _, ev := range []struct{ job, kind, data string }{
		{"job-guidelines", "start", `{"job": "job-guidelines", "attempt": 2}`},
		{"job-guidelines", "checkpoint", `{"categories": ["tone"], "from": "job log", "total": 4}`},
		{"job-guidelines", "progress", `{"operation": "write", "category": "claims", "persisted": ["tone", "claims"]}`},
		{"job-failed", "outcome", `{"status": "failed", "reason": ` + jsonString(hostile) + `, "skills_disabled": ["old-skill"]}`},
		{"job-globex", "outcome", `{"status": "failed", "reason": "globex's secret"}`},
	} {
		d.exec(`INSERT INTO mirror_job_events (job_id, attempt, kind, data) VALUES ($1, 2, $2, $3::jsonb)`, ev.job, ev.kind, ev.data)
	}
	e := d.as("ada")

	body := get(e, "/orgs/acme/jobs").Expect().Status(http.StatusOK).Body().Raw()
	p := doc(t, body, "/orgs/acme")
	if got := texts(testid(p, "job-link")); len(got) != 2 || !strings.Contains(strings.Join(got, ","), "job-guidelines") {
		t.Errorf("jobs listed %v", got)
	}
	if strings.Contains(body, "globex") {
		t.Error("the jobs page shows another org's job")
	}
	if got, _ := testid(p, "job-link").First().Attr("href"); !strings.HasPrefix(got, "/orgs/acme/jobs/job-") {
		t.Errorf("a job links %q", got)
	}

	// A checkpointed run: the progress its newest event states, of the total an event named.
	p = page(t, e, "/orgs/acme/jobs/job-guidelines", "/orgs/acme")
	if max, _ := testid(p, "job-progress-bar").Attr("max"); max != "4" {
		t.Errorf("progress max %q", max)
	}
	if v, _ := testid(p, "job-progress-bar").Attr("value"); v != "2" {
		t.Errorf("progress value %q", v)
	}
	if got := testid(p, "job-progress-text").Text(); !strings.Contains(got, "2 of 4") || !strings.Contains(got, "50%") {
		t.Errorf("progress text %q", got)
	}
	if got := texts(testid(p, "job-event-kind")); strings.Join(got, ",") != "start,checkpoint,progress" {
		t.Errorf("events %v", got)
	}

	// An ended job: its outcome, the reason as text, the skills the cap disabled; no progress.
	p = page(t, e, "/orgs/acme/jobs/job-failed", "/orgs/acme")
	if got := testid(p, "job-reason").Text(); got != hostile {
		t.Errorf("reason %q", got)
	}
	if got := testid(p, "job-error").Text(); got != hostile {
		t.Errorf("error %q", got)
	}
	if got := texts(testid(p, "job-skill-disabled")); strings.Join(got, ",") != "old-skill" {
		t.Errorf("skills disabled %v", got)
	}
	if testid(p, "job-progress").Length() != 0 {
		t.Error("progress shown for a run without progress events")
	}

	// Another org's job, and one that does not exist, are the same 404.
	for _, id := range []string{"job-globex", "no-such-job"} {
		b := get(e, "/orgs/acme/jobs/"+id).Expect().Status(http.StatusNotFound).Body().Raw()
		if strings.Contains(b, "globex's secret") || strings.Contains(b, "product_ingest") {
			t.Errorf("%s: the 404 shows the job", id)
		}
	}
	// Without an assertion, nothing.
	d.anonymous().GET("/orgs/acme/jobs/job-guidelines").Expect().Status(http.StatusUnauthorized)
}

func TestTheJobsPageSaysWhatToDoWithNoJobs(t *testing.T) {
	other := newOrgHome(t, filepath.Join(t.TempDir(), "orgs"), "initech", 0)
	p := page(t, newDash(t, dashOptions{home: other}).as("ada"), "/orgs/initech/jobs", "/orgs/initech")
	if got := testid(p, "jobs-none").Text(); !strings.Contains(got, "queue") {
		t.Errorf("empty state %q", got)
	}
	if cur, _ := testid(p, "nav-jobs").Attr("aria-current"); cur != "page" {
		t.Error("the jobs page is not marked open")
	}
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
