package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"hermeshost/gateway"
	"hermeshost/internal/statetest"
	"hermeshost/orghome"
	"hermeshost/sartiq"
	"hermeshost/scriptedagent"
	"hermeshost/subagent"
)

// The tests of this file hold the worker to the real Hermes CLI's contract (HERMES.md): the
// scripted agent refuses a run configured by the environment alone, so a job that completes
// reached the gateway through the config.yaml the worker wrote.

func readSettings(t *testing.T, home string) (string, map[string]any) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(home, "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(raw, &m); err != nil {
		t.Fatalf("config.yaml: %v\n%s", err, raw)
	}
	return string(raw), m
}

func dig(m map[string]any, keys ...string) any {
	var v any = m
	for _, k := range keys {
		mm, _ := v.(map[string]any)
		v = mm[k]
	}
	return v
}

func TestAgentReachesTheGatewayThroughTheConfigTheWorkerWrites(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, kind string) {
		w := newWorld(t, kind)
		ctx := context.Background()
		person := "# acme's settings, kept by a person\ndisplay:\n  skin: mono # their theme\nmemory:\n  memory_char_limit: 3000\n"
		if err := os.WriteFile(filepath.Join(w.home("acme"), "config.yaml"), []byte(person), 0o600); err != nil {
			t.Fatal(err)
		}
		job := w.backend.DemoJob(t, "acme", sartiq.TypeGuidelinesExtraction)
		r := w.runJob(ctx, "acme", job, nil)
		if r.err != nil || r.outcome.Status != "completed" {
			t.Fatalf("worker: %v %v outcome %+v\n%s", r.err, r.status, r.outcome, r.stderr)
		}
		text, m := readSettings(t, w.home("acme"))
		for _, kept := range []string{"# acme's settings, kept by a person", "skin: mono # their theme", "memory_char_limit: 3000"} {
			if !strings.Contains(text, kept) {
				t.Errorf("config.yaml lost %q:\n%s", kept, text)
			}
		}
		if dig(m, "model", "provider") != "hermes-host" || dig(m, "model", "default") != "demo-worker" ||
			dig(m, "providers", "hermes-host", "base_url") != w.gateway+"/v1" ||
			dig(m, "providers", "hermes-host", "key_env") != "HERMES_HOST_GATEWAY_KEY" ||
			dig(m, "security", "tirith_enabled") != false {
			t.Fatalf("config.yaml does not name the gateway as the provider:\n%s", text)
		}
		key, _ := gateway.OrgKey(gatewaySecret, "acme")
		if strings.Contains(text, key) {
			t.Fatal("the gateway key was written into config.yaml")
		}
		if enabled, _ := dig(m, "plugins", "enabled").([]any); !slices.Contains(enabled, any("hermes_host")) {
			t.Fatalf("the plugin is not enabled:\n%s", text)
		}
		for _, f := range []string{orghome.NoBundledSkillsFile, "plugins/hermes_host/plugin.yaml", "plugins/hermes_host/__init__.py"} {
			if _, err := os.Stat(filepath.Join(w.home("acme"), f)); err != nil {
				t.Errorf("the home lacks %s: %v", f, err)
			}
		}
		// What the model behind the gateway wrote is what was proposed.
		var content string
		if err := w.backend.DB.QueryRow(ctx, `SELECT content FROM guidelines_proposals WHERE job_id = $1 LIMIT 1`, job).Scan(&content); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(content, "demo reply ") {
			t.Fatalf("a proposal not written by the gateway's model: %q", content)
		}
		// Hermes' sessions stay open and untitled after a headless run.
		s := w.sessions(ctx, "acme")
		if len(s) != 1 || !s[0].EndedAt.IsZero() || s[0].Title != "" || s[0].Model != "demo-worker" {
			t.Fatalf("session after the job: %+v", s)
		}
	})
}

func TestMalformedConfigFailsTheJobAndIsLeftAsItWas(t *testing.T) {
	w := newWorld(t, "process")
	ctx := context.Background()
	bad := "model:\n  provider: hermes-host\n  default: [unclosed\nsecurity: {}\n"
	cfg := filepath.Join(w.home("acme"), "config.yaml")
	if err := os.WriteFile(cfg, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	job := w.backend.DemoJob(t, "acme", sartiq.TypeGuidelinesExtraction)
	r := w.runJob(ctx, "acme", job, nil)
	if r.outcome.Status != "failed" || !strings.Contains(r.outcome.Reason, cfg+" line ") {
		t.Fatalf("outcome %+v (want failed, naming %s and the line)\n%s", r.outcome, cfg, r.stderr)
	}
	if slices.Contains(r.kinds(), "agent_start") {
		t.Fatal("the agent started on a home whose config.yaml could not be read")
	}
	if raw, _ := os.ReadFile(cfg); string(raw) != bad {
		t.Fatalf("config.yaml changed:\n%s", raw)
	}
	if j := w.job(ctx, job); j.Status != sartiq.StatusFailed || j.Error == nil || !strings.Contains(*j.Error, "line ") {
		t.Fatalf("backend job %s %v", j.Status, j.Error)
	}
}

// writeAuthoredSkills makes n authored skills at depths one to three, each last used a
// minute after the one before in Hermes' skills/.usage.json; it returns their names, least
// recently used first.
func writeAuthoredSkills(t *testing.T, home string, n int) []string {
	t.Helper()
	usage := map[string]any{}
	base := time.Date(2026, 11, 1, 9, 0, 0, 0, time.UTC)
	var names []string
	for i := range n {
		name := fmt.Sprintf("skill-%02d", i)
		dir := []string{name, "research/" + name, "mlops/inference/" + name}[i%3]
		p := filepath.Join(home, "skills", dir, "SKILL.md")
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("---\nname: "+name+"\ndescription: does thing "+name+"\n---\nSteps.\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		used := base.Add(time.Duration(i) * time.Minute).Format("2006-01-02T15:04:05.000000+00:00")
		usage[name] = map[string]any{"use_count": 1, "view_count": 1, "last_used_at": used, "last_viewed_at": used,
			"patch_count": 0, "created_at": base.Format(time.RFC3339), "state": "active", "pinned": false}
		names = append(names, name)
	}
	for _, cat := range []string{"research", "mlops"} {
		if err := os.WriteFile(filepath.Join(home, "skills", cat, "DESCRIPTION.md"), []byte("---\ndescription: "+cat+"\n---\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := json.Marshal(usage)
	if err := os.WriteFile(filepath.Join(home, "skills", ".usage.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	return names
}

func countSkillFiles(t *testing.T, home string) int {
	t.Helper()
	n := 0
	_ = filepath.WalkDir(filepath.Join(home, "skills"), func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == "SKILL.md" {
			n++
		}
		return err
	})
	return n
}

func TestSkillCapDisablesTheLeastRecentlyUsedBeforeTheAgentStarts(t *testing.T) {
	w := newWorld(t, "process")
	ctx := context.Background()
	names := writeAuthoredSkills(t, w.home("acme"), 45)
	job := w.backend.DemoJob(t, "acme", sartiq.TypeProductIngest)
	claim, err := w.bot.Claim(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	r := w.execLive(ctx, "acme", claim, nil, live{env: []string{"SKILLS_MAX_AUTHORED=40"}})
	if r.outcome.Status != "completed" {
		t.Fatalf("outcome %+v\n%s", r.outcome, r.stderr)
	}
	want := names[:5]
	if !slices.Equal(r.outcome.SkillsDisabled, want) {
		t.Fatalf("the outcome says %v were disabled, want %v", r.outcome.SkillsDisabled, want)
	}
	kinds := r.kinds()
	if i, j := slices.Index(kinds, "skills_cap"), slices.Index(kinds, "agent_start"); i < 0 || j < i {
		t.Fatalf("the cap is not applied before the agent starts: %v", kinds)
	}
	_, m := readSettings(t, w.home("acme"))
	disabled, _ := dig(m, "skills", "disabled").([]any)
	var got []string
	for _, d := range disabled {
		got = append(got, fmt.Sprint(d))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("skills.disabled = %v, want %v", got, want)
	}
	if n := countSkillFiles(t, w.home("acme")); n != 45 {
		t.Fatalf("%d SKILL.md files after the cap, want all 45", n)
	}
	// The next job finds 40 enabled and disables nothing more.
	job2 := w.backend.AddJob(t, "acme", sartiq.TypeProductIngest)
	claim2, err := w.bot.Claim(ctx, job2)
	if err != nil {
		t.Fatal(err)
	}
	r2 := w.execLive(ctx, "acme", claim2, nil, live{env: []string{"SKILLS_MAX_AUTHORED=40"}})
	if r2.outcome.Status != "completed" || len(r2.outcome.SkillsDisabled) != 0 {
		t.Fatalf("second job: %+v", r2.outcome)
	}
}

// An agent killed mid-write (as a killed worker kills it) leaves state.db with a hot
// journal, which the host's read-only look at skill usage cannot open. The next job goes on
// without the cap that start, and its agent, opening state.db read-write, rolls the journal
// back; the job after that applies the cap again. Before, every attempt crashed on it.
func TestAJobStartsOnAStateDBAKilledAgentLeftMidWrite(t *testing.T) {
	w := newWorld(t, "process")
	ctx := context.Background()
	names := writeAuthoredSkills(t, w.home("acme"), 42)
	capped := live{env: []string{"SKILLS_MAX_AUTHORED=40"}}
	run := func(kind string) result {
		t.Helper()
		claim, err := w.bot.Claim(ctx, w.backend.AddJob(t, "acme", kind))
		if err != nil {
			t.Fatal(err)
		}
		return w.execLive(ctx, "acme", claim, nil, capped)
	}
	if r := run(sartiq.TypeProductIngest); r.outcome.Status != "completed" || len(r.outcome.SkillsDisabled) != 2 {
		t.Fatalf("first job: %+v\n%s", r.outcome, r.stderr)
	}
	statetest.InterruptWrite(t, filepath.Join(w.home("acme"), orghome.StateFile))
	writeAuthoredSkills(t, w.home("acme"), 43) // one more authored skill for the cap to find

	r := run(sartiq.TypeProductIngest)
	if r.outcome.Status != "completed" {
		t.Fatalf("the job on a state.db with a hot journal: %+v\n%s", r.outcome, r.stderr)
	}
	if len(r.outcome.SkillsDisabled) != 0 || slices.Contains(r.kinds(), "skills_cap") {
		t.Fatalf("a cap was applied on usage the host could not read: %+v", r.outcome)
	}
	if !strings.Contains(r.stderr, "skills cap not applied this time") || !strings.Contains(r.stderr, "did not finish") {
		t.Fatalf("the worker's log does not say why the cap waited:\n%s", r.stderr)
	}
	if _, err := os.Stat(filepath.Join(w.home("acme"), orghome.StateFile+"-journal")); !os.IsNotExist(err) {
		t.Fatalf("the agent's read-write open left the journal: %v", err)
	}
	if s := w.sessions(ctx, "acme"); len(s) != 2 {
		t.Fatalf("%d sessions after the agent recovered state.db, want the 2 jobs'", len(s))
	}
	r = run(sartiq.TypeProductIngest)
	if r.outcome.Status != "completed" || !slices.Equal(r.outcome.SkillsDisabled, names[2:3]) {
		t.Fatalf("the job after recovery: disabled %v, want %v (%+v)", r.outcome.SkillsDisabled, names[2:3], r.outcome)
	}
}

func TestTurnLimitWithAJSONSummaryIsResumedNotCompleted(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, kind string) {
		w := newWorld(t, kind)
		ctx := context.Background()
		// The summary at the limit ends in {"categories": [the two so far]}: JSON that is no
		// final answer.
		w.knobs("acme", scriptedagent.Knobs{StopAfterWrites: 2, SummaryJSON: true})
		job := w.backend.DemoJob(t, "acme", sartiq.TypeGuidelinesExtraction)
		r := w.runJob(ctx, "acme", job, nil)
		if r.outcome.Status != "completed" {
			t.Fatalf("outcome %+v\n%s", r.outcome, r.stderr)
		}
		var resumed string
		for _, e := range r.events {
			if e["event"] == "resume" {
				resumed, _ = e["data"].(map[string]any)["session"].(string)
			}
		}
		sessions := w.sessions(ctx, "acme")
		if len(sessions) != 1 || resumed != sessions[0].ID {
			t.Fatalf("resumed %q; sessions %+v", resumed, sessions)
		}
		var check struct {
			Session    string `json:"session"`
			TurnLimits int    `json:"turn_limits"`
		}
		raw, _ := os.ReadFile(filepath.Join(w.home("acme"), "workspaces", job, "checkpoint.json"))
		if json.Unmarshal(raw, &check) != nil || check.Session != resumed || check.TurnLimits != 1 {
			t.Fatalf("checkpoint %s", raw)
		}
		if got := w.guidelines(ctx, job); len(got) != 5 {
			t.Fatalf("proposals: %v", got)
		}
		// As the real CLI stores it: a user message per run (the prompt, then the resumed
		// one) and the turn-limit notice, nothing else in the user's name.
		h, err := orghome.OpenHome("acme", w.home("acme"))
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		st, err := h.OpenState()
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		tr, err := st.Transcript(ctx, resumed)
		if err != nil {
			t.Fatal(err)
		}
		var users []string
		for _, m := range tr.Messages {
			if m.Role == "user" {
				users = append(users, m.Content)
			}
		}
		if len(users) != 3 || users[1] != scriptedagent.TurnLimitNotice {
			t.Fatalf("the session's user messages: %q", users)
		}
	})
}

func TestTurnLimitEveryRunFailsAfterMaxResumes(t *testing.T) {
	w := newWorld(t, "process")
	ctx := context.Background()
	job := w.backend.DemoJob(t, "acme", sartiq.TypeGuidelinesExtraction)
	claim, err := w.bot.Claim(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	// One write per run, five categories, two resumes: the third run stops at its limit too.
	r := w.execLive(ctx, "acme", claim, nil, live{env: []string{"MAX_TURNS=1", "MAX_RESUMES=2"}})
	if r.outcome.Status != "failed" || !strings.Contains(r.outcome.Reason, "turn limit (1 turns) 3 times") {
		t.Fatalf("outcome %+v\n%s", r.outcome, r.stderr)
	}
	if got := w.guidelines(ctx, job); len(got) != 3 {
		t.Fatalf("proposals: %v", got)
	}
}

// make run's demo pace: children one after another, each with an id made as Hermes makes
// them, and every write and child step slowed (here a little) so a run can be watched.
func TestChildrenOneAfterAnotherWithHermesIDs(t *testing.T) {
	w := newWorld(t, "process")
	ctl := startControl(t)
	ctx := context.Background()
	w.knobs("acme", scriptedagent.Knobs{StepMS: 20, Subagents: []scriptedagent.SubagentKnob{
		{Goal: "collect the sources", Role: "researcher"}, {Goal: "review the draft", Role: "reviewer"},
	}})
	job := w.backend.DemoJob(t, "acme", sartiq.TypeGuidelinesExtraction)
	claim, err := w.bot.Claim(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	r := w.execLive(ctx, "acme", claim, nil, live{env: ctl.env(t, "acme")})
	if r.outcome.Status != "completed" {
		t.Fatalf("outcome %+v\n%s", r.outcome, r.stderr)
	}
	hs, err := ctl.subs.List(ctx, "acme", subagent.ListParams{JobID: job})
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) != 2 {
		t.Fatalf("%d children recorded, want 2: %+v", len(hs), hs)
	}
	idPattern := regexp.MustCompile(`^sa-[01]-[0-9a-f]{8}$`)
	for _, h := range hs {
		if !idPattern.MatchString(h.ID) || h.Status != subagent.Done {
			t.Fatalf("child %+v", h)
		}
	}
}
