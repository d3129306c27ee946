package orghome

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"hermeshost/orghome/hermesstate"
)

func skillMD(name, description string) string {
	return "---\nname: " + name + "\ndescription: " + description + "\nversion: 1.2.0\nmetadata:\n  hermes:\n    tags: [a, b]\n---\n\n# " + name + "\n\nSteps.\n"
}

func TestSkillsAreParsedAndProblemsReported(t *testing.T) {
	_, h := newHome(t, "acme")
	sk := filepath.Join(h.Dir, "skills")
	writeFile(t, sk, "research/arxiv/SKILL.md", skillMD("arxiv", "Search arXiv papers."))
	writeFile(t, sk, "flat-skill/SKILL.md", "\ufeff"+skillMD("flat-skill", "A skill without a category."))
	writeFile(t, sk, "research/broken-yaml/SKILL.md", "---\nname: broken-yaml\ndescription: [unclosed\n---\nbody\n")
	writeFile(t, sk, "research/no-front/SKILL.md", "# just markdown\n")
	writeFile(t, sk, "research/no-close/SKILL.md", "---\nname: no-close\ndescription: x\n")
	writeFile(t, sk, "research/mismatch/SKILL.md", skillMD("other-name", "Name differs from folder."))
	writeFile(t, sk, "research/Upper/SKILL.md", skillMD("Upper", "Capital letters."))
	writeFile(t, sk, "research/no-desc/SKILL.md", "---\nname: no-desc\n---\n")
	writeFile(t, sk, "research/long-desc/SKILL.md", skillMD("long-desc", strings.Repeat("d", MaxSkillDescriptionLen+1)))
	writeFile(t, sk, "research/oversize/SKILL.md", skillMD("oversize", "Too big.")+strings.Repeat("x", MaxSkillFileChars))
	// Characters, not bytes: 90,000 three-byte characters are within Hermes' limit.
	writeFile(t, sk, "research/wide/SKILL.md", skillMD("wide", "Wide characters.")+strings.Repeat("€", 90_000))
	writeFile(t, sk, "ops/arxiv/SKILL.md", skillMD("arxiv", "A second arxiv."))
	writeFile(t, sk, "research/empty-folder/notes.txt", "no skill here")
	writeFile(t, sk, ".hub/lock.json", `{"installed": {}}`)
	writeFile(t, sk, ".archive/old/SKILL.md", skillMD("old", "Archived by the curator."))
	outside := writeFile(t, t.TempDir(), "evil/SKILL.md", skillMD("evil", "Lives outside the home."))
	symlink(t, filepath.Dir(outside), filepath.Join(sk, "research", "evil"))

	bundledDir := t.TempDir()
	writeFile(t, bundledDir, "software/github/SKILL.md", skillMD("github", "Bundled GitHub skill."))
	writeFile(t, bundledDir, "software/flat-skill/SKILL.md", skillMD("flat-skill", "Bundled twin of an authored skill."))
	bundled, err := ReadBundled(bundledDir)
	if err != nil {
		t.Fatal(err)
	}

	set, err := h.Skills(bundled)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range set.Skills {
		tag := s.Name
		if s.Source == SkillBundled {
			tag = "bundled:" + tag
		}
		names = append(names, tag)
	}
	if want := []string{"arxiv", "arxiv", "flat-skill", "bundled:flat-skill", "bundled:github", "wide"}; !reflect.DeepEqual(names, want) {
		t.Errorf("skills = %v, want %v", names, want)
	}
	for _, s := range set.Skills {
		if s.Name == "arxiv" && s.Category == "research" {
			if s.Description != "Search arXiv papers." || s.Version != "1.2.0" || s.Dir != "research/arxiv" || s.Metadata["hermes"] == nil {
				t.Errorf("arxiv parsed as %+v", s)
			}
		}
	}
	reasons := map[string]string{}
	for _, b := range set.Broken {
		reasons[b.Dir] = b.Reason
	}
	wantBroken := map[string]string{
		"research/broken-yaml":  "not valid YAML",
		"research/no-front":     "does not start with YAML frontmatter",
		"research/no-close":     "no closing ---",
		"research/mismatch":     "does not match its folder",
		"research/Upper":        "is not lowercase",
		"research/no-desc":      "no description",
		"research/long-desc":    "description is over 1024",
		"research/oversize":     "over Hermes' limit of 100000 characters",
		"research/evil":         "points outside the home",
		"research/empty-folder": "no SKILL.md",
	}
	for dir, want := range wantBroken {
		if !strings.Contains(reasons[dir], want) {
			t.Errorf("broken %s: reason %q, want it to say %q", dir, reasons[dir], want)
		}
	}
	if len(reasons) != len(wantBroken) {
		t.Errorf("broken = %v", set.Broken)
	}
	dups := map[string][]string{}
	for _, d := range set.Duplicates {
		dups[d.Name] = d.Dirs
	}
	if fmt.Sprint(dups["arxiv"]) != "[ops/arxiv research/arxiv]" && fmt.Sprint(dups["arxiv"]) != "[research/arxiv ops/arxiv]" {
		t.Errorf("duplicate arxiv: %v", dups)
	}
	if len(dups["flat-skill"]) != 2 || len(dups) != 2 {
		t.Errorf("duplicates: %v", dups)
	}
}

// capFixture is a home with five authored skills, a Hub skill, a bundled-manifest skill,
// a config.yaml full of other settings, and Hermes' own record of which skills were used.
func capFixture(t *testing.T) (*Home, *Bundled, string) {
	t.Helper()
	_, h := newHome(t, "acme")
	sk := filepath.Join(h.Dir, "skills")
	long := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	for i, name := range []string{"alpha", "bravo", "charlie", "delta", "echo", "hubbed", "seeded"} {
		p := writeFile(t, sk, "work/"+name+"/SKILL.md", skillMD(name, "Skill "+name+"."))
		// File times that would pick the wrong skills if usage were read from them.
		mt := long.Add(time.Duration(len("abcdefg")-i) * time.Hour)
		if err := os.Chtimes(p, mt, mt); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, sk, ".hub/lock.json", `{"version": 1, "installed": {"hubbed": {"source": "hub"}}}`)
	writeFile(t, sk, ".bundled_manifest", "seeded:abc123\n")
	config := "# Hermes settings\nmodel:\n  default: demo-model # the gateway's model\n  provider: custom\nskills:\n  external_dirs:\n    - /opt/hermes/skills\n  disabled:\n    - echo\nmemory:\n  memory_char_limit: 2200\n"
	writeFile(t, h.Dir, "config.yaml", config)

	// Usage as Hermes records it: skill_view tool calls in state.db, and the curator sidecar.
	db := stateFixture(t, h, 1)
	ctx := context.Background()
	view := func(name string, at float64) {
		must(t, hermesstate.InsertMessage(ctx, db, hermesstate.Message{SessionID: "s00000", Role: "assistant", Timestamp: at,
			ToolCalls: []hermesstate.ToolCall{{ID: "c", Name: "skill_view", Arguments: `{"name":"` + name + `"}`}}}))
	}
	view("alpha", 1_700_000_300)
	view("work/charlie", 1_700_000_100)                                                                          // skill_view also takes category/name
	view("charlie", 1_700_000_050)                                                                               // an older view does not win
	view("github", 1_700_000_900)                                                                                // bundled: never counted
	writeFile(t, sk, ".usage.json", `{"bravo": {"last_used_at": "2023-11-14T22:16:40+00:00", "view_count": 3}}`) // 1_700_000_200

	bundledDir := t.TempDir()
	writeFile(t, bundledDir, "software/github/SKILL.md", skillMD("github", "Bundled."))
	bundled, err := ReadBundled(bundledDir)
	if err != nil {
		t.Fatal(err)
	}
	return h, bundled, config
}

func listSkillFiles(t *testing.T, dir string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == "SKILL.md" {
			files = append(files, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files)
	return files
}

func TestSkillUsageComesFromHermesOwnState(t *testing.T) {
	h, bundled, _ := capFixture(t)
	uses, err := h.SkillUsage(context.Background(), bundled)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, u := range uses {
		got[u.Name] = u.Source
	}
	want := map[string]string{"alpha": UsageStateDB, "bravo": UsageSidecar, "charlie": UsageStateDB, "delta": UsageModTime, "echo": UsageModTime}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("usage sources = %v, want %v", got, want)
	}
	var order []string
	for _, u := range uses {
		order = append(order, u.Name)
	}
	// Recorded uses are from November 2023; delta and echo were never used and fall back to
	// their 2024 file times, which rank them newest: a skill just written is not the first to go.
	if fmt.Sprint(order) != "[charlie bravo alpha echo delta]" {
		t.Fatalf("least recently used first = %v", order)
	}
}

func TestSkillCapDisablesExactlyTheLeastRecentlyUsed(t *testing.T) {
	h, bundled, config := capFixture(t)
	filesBefore := listSkillFiles(t, h.Dir)
	res, err := h.EnforceSkillCap(context.Background(), 2, bundled)
	if err != nil {
		t.Fatal(err)
	}
	var disabled []string
	for _, u := range res.Disabled {
		disabled = append(disabled, u.Name)
	}
	// Enabled authored skills, least recently used first: charlie, bravo, alpha, delta (echo
	// was already disabled). Two may stay: charlie and bravo go.
	if fmt.Sprint(disabled) != "[charlie bravo]" || fmt.Sprint(res.AlreadyDisabled) != "[echo]" || res.Enabled != 2 || res.Authored != 5 {
		t.Fatalf("cap result = %+v (disabled %v)", res, disabled)
	}

	raw, err := os.ReadFile(filepath.Join(h.Dir, "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Model  map[string]string `yaml:"model"`
		Skills struct {
			ExternalDirs []string `yaml:"external_dirs"`
			Disabled     []string `yaml:"disabled"`
		} `yaml:"skills"`
		Memory map[string]int `yaml:"memory"`
	}
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(cfg.Skills.Disabled) != "[bravo charlie echo]" {
		t.Errorf("skills.disabled = %v", cfg.Skills.Disabled)
	}
	if cfg.Model["default"] != "demo-model" || cfg.Model["provider"] != "custom" || cfg.Memory["memory_char_limit"] != 2200 ||
		fmt.Sprint(cfg.Skills.ExternalDirs) != "[/opt/hermes/skills]" {
		t.Errorf("other settings lost: %s", raw)
	}
	for _, c := range []string{"# Hermes settings", "# the gateway's model"} {
		if !bytes.Contains(raw, []byte(c)) {
			t.Errorf("comment %q lost:\n%s", c, raw)
		}
	}
	for _, never := range []string{"github", "hubbed", "seeded"} {
		if bytes.Contains(raw, []byte("- "+never)) {
			t.Errorf("%s (not authored) was disabled:\n%s", never, raw)
		}
	}
	if got := listSkillFiles(t, h.Dir); !reflect.DeepEqual(got, filesBefore) {
		t.Errorf("skill files changed: %v, was %v", got, filesBefore)
	}
	receipts, err := h.Receipts("config.yaml")
	if err != nil || len(receipts) != 1 {
		t.Fatalf("receipts of config.yaml = %v, %v", receipts, err)
	}
	if kept, _ := os.ReadFile(receipts[0].Path); string(kept) != config {
		t.Errorf("receipt = %q, want the previous config", kept)
	}

	// Hermes reads the list back as the cap wrote it.
	set, err := h.Skills(bundled)
	if err != nil {
		t.Fatal(err)
	}
	sources := map[string]string{}
	for _, s := range set.Skills {
		if want := s.Name == "bravo" || s.Name == "charlie" || s.Name == "echo"; s.Disabled != want {
			t.Errorf("%s disabled = %v", s.Name, s.Disabled)
		}
		sources[s.Name] = s.Source
	}
	if sources["hubbed"] != SkillHub || sources["seeded"] != SkillSeeded || sources["github"] != SkillBundled || sources["alpha"] != SkillAuthored {
		t.Errorf("skill sources = %v", sources)
	}

	// Idempotent: a second run changes nothing, not even the file's inode.
	before, _ := os.Stat(filepath.Join(h.Dir, "config.yaml"))
	again, err := h.EnforceSkillCap(context.Background(), 2, bundled)
	if err != nil || len(again.Disabled) != 0 {
		t.Fatalf("second run = %+v, %v", again, err)
	}
	after, _ := os.Stat(filepath.Join(h.Dir, "config.yaml"))
	if !os.SameFile(before, after) {
		t.Error("second run rewrote config.yaml")
	}
}

func TestSkillCapNeverDisablesANameBundledSkillsShare(t *testing.T) {
	_, h := newHome(t, "acme")
	writeFile(t, h.Dir, "skills/mine/github/SKILL.md", skillMD("github", "An authored twin of a bundled skill."))
	writeFile(t, h.Dir, "skills/mine/solo/SKILL.md", skillMD("solo", "Authored."))
	writeFile(t, h.Dir, "skills/mine/duo/SKILL.md", skillMD("duo", "Authored."))
	bundledDir := t.TempDir()
	writeFile(t, bundledDir, "software/github/SKILL.md", skillMD("github", "Bundled."))
	bundled, err := ReadBundled(bundledDir)
	if err != nil {
		t.Fatal(err)
	}
	res, err := h.EnforceSkillCap(context.Background(), 1, bundled)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Disabled) != 1 || res.Disabled[0].Name == "github" {
		t.Fatalf("disabled %+v; github names a bundled skill too", res.Disabled)
	}
}

func TestSkillCapRefusesAConfigItCannotParse(t *testing.T) {
	h, bundled, _ := capFixture(t)
	bad := "model: [unclosed\n"
	writeFile(t, h.Dir, "config.yaml", bad)
	if _, err := h.EnforceSkillCap(context.Background(), 1, bundled); err == nil || !strings.Contains(err.Error(), "not valid YAML") {
		t.Fatalf("cap over a broken config.yaml: %v", err)
	}
	if raw, _ := os.ReadFile(filepath.Join(h.Dir, "config.yaml")); string(raw) != bad {
		t.Fatal("a broken config.yaml was overwritten")
	}
}

func TestSkillCapWithoutConfigCreatesOnlyTheDisabledList(t *testing.T) {
	_, h := newHome(t, "acme")
	writeFile(t, h.Dir, "skills/a/one/SKILL.md", skillMD("one", "One."))
	writeFile(t, h.Dir, "skills/a/two/SKILL.md", skillMD("two", "Two."))
	if _, err := h.EnforceSkillCap(context.Background(), 1, nil); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(h.Dir, "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(raw), "skills:\n  disabled:\n    - ") {
		t.Fatalf("config.yaml = %q", raw)
	}
}

func TestDisabledListReadAsHermesReadsIt(t *testing.T) {
	cases := map[string][]string{
		"skills:\n  disabled: solo\n":                  {"solo"},
		"skills:\n  disabled: '[\"a\", \"b\"]'\n":      {"a", "b"},
		"skills:\n  disabled:\n    - x\n    - ' y '\n": {"x", "y"},
		"skills:\n  disabled:\n":                       {},
		"skills: {}\n":                                 {},
	}
	for raw, want := range cases {
		_, h := newHome(t, "acme")
		writeFile(t, h.Dir, "config.yaml", raw)
		cfg, err := h.readConfig()
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for n := range cfg.disabledSkills() {
			got = append(got, n)
		}
		sort.Strings(got)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%q: disabled = %v, want %v", raw, got, want)
		}
	}
}
