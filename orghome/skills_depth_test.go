package orghome

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

func descriptionMD(description string) string {
	return "---\ndescription: " + description + "\n---\n\nWhat this category is for.\n"
}

// skillRows lists skills as "dir=category" for comparison, sorted by dir.
func skillRows(skills []Skill) []string {
	var rows []string
	for _, s := range skills {
		rows = append(rows, s.Dir+"="+s.Category)
	}
	sort.Strings(rows)
	return rows
}

func categoryRows(cats []Category) []string {
	var rows []string
	for _, c := range cats {
		rows = append(rows, c.Dir+"="+c.Description)
	}
	return rows
}

func brokenReasons(broken []BrokenSkill) map[string]string {
	out := map[string]string{}
	for _, b := range broken {
		out[b.Dir] = b.Reason
	}
	return out
}

// checkBroken wants exactly the folders of want reported, each with a reason containing its text.
func checkBroken(t *testing.T, broken []BrokenSkill, want map[string]string) {
	t.Helper()
	got := brokenReasons(broken)
	for dir, text := range want {
		if !strings.Contains(got[dir], text) {
			t.Errorf("broken %s: reason %q, want it to say %q", dir, got[dir], text)
		}
	}
	for dir, reason := range got {
		if _, ok := want[dir]; !ok {
			t.Errorf("reported broken, but is not: %s (%s)", dir, reason)
		}
	}
}

func TestSkillsAreFoundAtAnyDepth(t *testing.T) {
	_, h := newHome(t, "acme")
	sk := filepath.Join(h.Dir, "skills")
	// Depth one, with the support folders a skill keeps. A SKILL.md in references/ is an
	// archived package (Hermes does not walk support folders of a skill); examples/ is the
	// skill's own folder, not a broken skill.
	writeFile(t, sk, "arxiv/SKILL.md", skillMD("arxiv", "Search arXiv."))
	writeFile(t, sk, "arxiv/references/api.md", "notes")
	writeFile(t, sk, "arxiv/references/old-arxiv/SKILL.md", skillMD("old-arxiv", "Kept as data."))
	writeFile(t, sk, "arxiv/examples/demo.txt", "demo")
	// Hermes also walks a skill's other folders, so a SKILL.md there is a skill of its own.
	writeFile(t, sk, "arxiv/extras/arxiv-cli/SKILL.md", skillMD("arxiv-cli", "Nested in another skill."))
	// Depth two and three, categories with and without DESCRIPTION.md.
	writeFile(t, sk, "research/DESCRIPTION.md", descriptionMD("Finding and reading papers."))
	writeFile(t, sk, "research/arxiv2/SKILL.md", skillMD("arxiv2", "Depth two."))
	writeFile(t, sk, "mlops/DESCRIPTION.md", descriptionMD("'Training and serving models.'"))
	writeFile(t, sk, "mlops/inference/DESCRIPTION.md", descriptionMD("Serving models."))
	writeFile(t, sk, "mlops/inference/vllm/SKILL.md", skillMD("vllm", "Depth three."))
	writeFile(t, sk, "mlops/inference/vllm/templates/serve.yaml", "port: 8000\n")
	writeFile(t, sk, "mlops/inference/vllm/scripts/run.sh", "#!/bin/sh\n")
	writeFile(t, sk, "mlops/inference/vllm/assets/logo.png", "png")
	writeFile(t, sk, "tools/jq/SKILL.md", skillMD("jq", "Category without DESCRIPTION.md."))
	writeFile(t, sk, "lab/x/y/probe/SKILL.md", skillMD("probe", "Depth four."))
	writeFile(t, sk, "drafts/DESCRIPTION.md", descriptionMD("Not yet skills."))
	// scripts/ is a support folder only directly inside a skill; here it is a category.
	writeFile(t, sk, "scripts/deploy/SKILL.md", skillMD("deploy", "Under a folder named scripts."))
	if err := os.MkdirAll(filepath.Join(sk, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Folders Hermes skips.
	writeFile(t, sk, "node_modules/pkg/SKILL.md", skillMD("pkg", "A dependency."))
	writeFile(t, sk, ".archive/old/SKILL.md", skillMD("old", "Archived by the curator."))
	writeFile(t, sk, "research/.git/hooks/SKILL.md", skillMD("hooks", "Inside .git."))
	// Links: inside the home followed, out of the home refused, a loop stopped.
	writeFile(t, h.Dir, "shared/shared-notes/SKILL.md", skillMD("shared-notes", "Reached through a link."))
	symlink(t, filepath.Join("..", "..", "shared", "shared-notes"), filepath.Join(sk, "team", "shared-notes"))
	outside := writeFile(t, t.TempDir(), "evil/SKILL.md", skillMD("evil", "Lives outside the home."))
	symlink(t, filepath.Dir(outside), filepath.Join(sk, "research", "evil"))
	symlink(t, "..", filepath.Join(sk, "mlops", "back"))
	// Genuinely broken: files where a skill is expected, and no SKILL.md.
	writeFile(t, sk, "research/half-done/notes.md", "to do")
	writeFile(t, sk, "mlops/inference/sglang/README.md", "SKILL.md forgotten")

	bundledDir := t.TempDir()
	writeFile(t, bundledDir, "mlops/DESCRIPTION.md", descriptionMD("Bundled MLOps."))
	writeFile(t, bundledDir, "mlops/training/axolotl/SKILL.md", skillMD("axolotl", "Bundled, depth three."))
	writeFile(t, bundledDir, "mlops/training/axolotl/references/config.md", "ref")
	writeFile(t, bundledDir, "note-taking/DESCRIPTION.md", descriptionMD("Notes."))
	writeFile(t, bundledDir, "note-taking/obsidian/SKILL.md", skillMD("obsidian", "Bundled, depth two."))
	writeFile(t, bundledDir, "dogfood/SKILL.md", skillMD("dogfood", "Bundled, depth one."))
	writeFile(t, bundledDir, "software/gh/SKILL.md", skillMD("gh", "Bundled, no DESCRIPTION.md above."))
	writeFile(t, bundledDir, "software/gh/scripts/helper/SKILL.md", skillMD("helper", "Support folder of gh."))
	writeFile(t, bundledDir, "tools/DESCRIPTION.md", descriptionMD("Bundled tools."))
	writeFile(t, bundledDir, "tools/yq/SKILL.md", skillMD("yq", "Bundled."))
	writeFile(t, bundledDir, ".github/workflows/SKILL.md", skillMD("workflows", "CI of the image."))

	bundled, err := ReadBundled(bundledDir)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := skillRows(bundled.Skills), []string{"dogfood=", "mlops/training/axolotl=mlops/training",
		"note-taking/obsidian=note-taking", "software/gh=software", "tools/yq=tools"}; !reflect.DeepEqual(got, want) {
		t.Errorf("bundled skills = %v, want %v", got, want)
	}
	if got, want := categoryRows(bundled.Categories), []string{"mlops=Bundled MLOps.", "mlops/training=",
		"note-taking=Notes.", "software=", "tools=Bundled tools."}; !reflect.DeepEqual(got, want) {
		t.Errorf("bundled categories = %v, want %v", got, want)
	}
	checkBroken(t, bundled.Broken, nil)

	set, err := h.Skills(bundled)
	if err != nil {
		t.Fatal(err)
	}
	var home []Skill
	for _, s := range set.Skills {
		if s.Source != SkillBundled {
			home = append(home, s)
		}
	}
	want := []string{"arxiv/extras/arxiv-cli=arxiv/extras", "arxiv=", "lab/x/y/probe=lab/x/y", "mlops/inference/vllm=mlops/inference",
		"research/arxiv2=research", "scripts/deploy=scripts", "team/shared-notes=team", "tools/jq=tools"}
	if got := skillRows(home); !reflect.DeepEqual(got, want) {
		t.Errorf("home skills = %v, want %v", got, want)
	}
	if len(set.Skills) != len(home)+len(bundled.Skills) || len(set.Duplicates) != 0 {
		t.Errorf("merged %d skills, duplicates %v", len(set.Skills), set.Duplicates)
	}
	// One category per folder; the home's description wins, the bundled one fills a gap.
	wantCats := []string{"arxiv/extras=", "drafts=Not yet skills.", "lab=", "lab/x=", "lab/x/y=",
		"mlops=Training and serving models.", "mlops/inference=Serving models.", "mlops/training=",
		"note-taking=Notes.", "research=Finding and reading papers.", "scripts=", "software=", "team=", "tools=Bundled tools."}
	if got := categoryRows(set.Categories); !reflect.DeepEqual(got, wantCats) {
		t.Errorf("categories =\n%v\nwant\n%v", got, wantCats)
	}
	checkBroken(t, set.Broken, map[string]string{
		"research/half-done":     "no SKILL.md",
		"mlops/inference/sglang": "no SKILL.md",
		"research/evil":          "points outside the home",
		"mlops/back":             "a loop",
	})
}

func TestSkillWalkIsBounded(t *testing.T) {
	_, h := newHome(t, "acme")
	sk := filepath.Join(h.Dir, "skills")
	var chain []string
	for i := 1; i <= maxSkillTreeDepth+1; i++ {
		chain = append(chain, fmt.Sprintf("d%d", i))
	}
	deep := strings.Join(chain, "/")
	writeFile(t, sk, deep+"/SKILL.md", skillMD(chain[len(chain)-1], "Too deep to read."))
	writeFile(t, sk, "d1/ok/SKILL.md", skillMD("ok", "Within the bounds."))
	// Two links back up from one folder: without the loop check the walk would fan out.
	symlink(t, ".", filepath.Join(sk, "loop", "self"))
	symlink(t, "..", filepath.Join(sk, "loop", "up"))
	writeFile(t, sk, "loop/spin/SKILL.md", skillMD("spin", "Next to the loops."))

	set, err := h.Skills(nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := skillRows(set.Skills), []string{"d1/ok=d1", "loop/spin=loop"}; !reflect.DeepEqual(got, want) {
		t.Errorf("skills = %v, want %v", got, want)
	}
	checkBroken(t, set.Broken, map[string]string{
		deep:        fmt.Sprintf("more than %d folders deep", maxSkillTreeDepth),
		"loop/self": "a loop",
		"loop/up":   "a loop",
	})

	// Past the entry bound the walk stops and says where; the folder is not called skill-less.
	// The bound is lowered here: ten thousand files take seconds to create on a slow disk.
	_, big := newHome(t, "big")
	writeFile(t, big.Dir, "skills/a-first/SKILL.md", skillMD("a-first", "Read before the bound."))
	for i := 0; i < 20; i++ {
		writeFile(t, big.Dir, fmt.Sprintf("skills/heap/f%02d", i), "")
	}
	writeFile(t, big.Dir, "skills/z-after/SKILL.md", skillMD("z-after", "After the bound."))
	skills, broken, _, err := walkSkillTree(big, skillsDir, 10)
	if err != nil {
		t.Fatal(err)
	}
	if got := skillRows(skills); fmt.Sprint(got) != "[a-first=]" {
		t.Errorf("skills = %v", got)
	}
	checkBroken(t, broken, map[string]string{"heap": "over 10 entries"})
	// Within the real bound the same tree is read whole, and heap is a folder of files.
	skills, broken, _, err = walkSkillTree(big, skillsDir, maxSkillTreeEntries)
	if err != nil {
		t.Fatal(err)
	}
	if got := skillRows(skills); fmt.Sprint(got) != "[a-first= z-after=]" {
		t.Errorf("skills = %v", got)
	}
	checkBroken(t, broken, map[string]string{"heap": "no SKILL.md"})
}

// usageRecord is one entry of skills/.usage.json as tools/skill_usage.py writes it
// (_empty_record, timestamps from datetime.now(timezone.utc).isoformat()).
func usageRecord(lastUsed, lastViewed any) map[string]any {
	return map[string]any{
		"use_count": 3, "view_count": 5, "last_used_at": lastUsed, "last_viewed_at": lastViewed,
		"patch_count": 0, "last_patched_at": nil, "created_at": "2025-12-01T09:00:00.000001+00:00",
		"state": "active", "pinned": false, "archived_at": nil,
	}
}

func TestSkillCapSeesSkillsAtEveryDepth(t *testing.T) {
	_, h := newHome(t, "acme")
	sk := filepath.Join(h.Dir, "skills")
	usage := map[string]any{}
	for i := 1; i <= 45; i++ {
		name := fmt.Sprintf("s%02d", i)
		dir := map[int]string{1: name, 2: "cat-a/" + name, 0: "grp/sub/" + name}[i%3]
		writeFile(t, sk, dir+"/SKILL.md", skillMD(name, "Authored skill "+name+"."))
		writeFile(t, sk, dir+"/references/notes.md", "notes")
		usage[name] = usageRecord(fmt.Sprintf("2026-11-30T10:%02d:00.123456+00:00", i), nil)
	}
	// The five least recently used, at every depth and in every shape Hermes writes:
	// with microseconds, without, without an offset (read as UTC), only a view recorded.
	usage["s41"] = usageRecord("2026-01-01T00:00:00.000001+00:00", nil) // cat-a/s41
	usage["s10"] = usageRecord(nil, "2026-01-02T08:00:00+00:00")        // s10
	usage["s20"] = usageRecord("2026-01-03T09:30:00.5", nil)            // cat-a/s20
	usage["s45"] = usageRecord("2026-01-04T12:00:00+00:00", nil)        // grp/sub/s45
	usage["s03"] = usageRecord("2026-01-05T10:00:00.123456+00:00", nil) // grp/sub/s03
	// An old use but a recent view: the latest of the two counts.
	usage["s11"] = usageRecord("2025-01-01T00:00:00+00:00", "2026-11-29T00:00:00+00:00")
	// A seeded skill three folders down, older than all: not authored, never counted.
	writeFile(t, sk, "mlops/inference/seeded-vllm/SKILL.md", skillMD("seeded-vllm", "Seeded."))
	writeFile(t, sk, ".bundled_manifest", "seeded-vllm:0f3a\n")
	usage["seeded-vllm"] = usageRecord("2020-01-01T00:00:00+00:00", nil)
	sidecar, err := json.MarshalIndent(usage, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, sk, ".usage.json", string(sidecar))
	config := "# org settings\nmodel:\n  provider: gateway # set by the host\n  default: demo\nskills:\n  external_dirs:\n    - /opt/hermes/skills\nsecurity:\n  tirith_enabled: false\n"
	writeFile(t, h.Dir, "config.yaml", config)
	filesBefore := listSkillFiles(t, h.Dir)

	res, err := h.EnforceSkillCap(context.Background(), 40, nil)
	if err != nil {
		t.Fatal(err)
	}
	var disabled []string
	for _, u := range res.Disabled {
		disabled = append(disabled, u.Dir+"@"+u.Source)
	}
	want := "[cat-a/s41@skills/.usage.json s10@skills/.usage.json cat-a/s20@skills/.usage.json " +
		"grp/sub/s45@skills/.usage.json grp/sub/s03@skills/.usage.json]"
	if fmt.Sprint(disabled) != want || res.Authored != 45 || res.Enabled != 40 || len(res.AlreadyDisabled) != 0 {
		t.Fatalf("cap result: disabled %v, authored %d, enabled %d, already %v", disabled, res.Authored, res.Enabled, res.AlreadyDisabled)
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
		Security map[string]bool `yaml:"security"`
	}
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(cfg.Skills.Disabled) != "[s03 s10 s20 s41 s45]" {
		t.Errorf("skills.disabled = %v", cfg.Skills.Disabled)
	}
	if cfg.Model["provider"] != "gateway" || cfg.Model["default"] != "demo" || fmt.Sprint(cfg.Skills.ExternalDirs) != "[/opt/hermes/skills]" ||
		cfg.Security["tirith_enabled"] || !bytes.Contains(raw, []byte("security:\n  tirith_enabled: false")) {
		t.Errorf("other settings lost:\n%s", raw)
	}
	for _, c := range []string{"# org settings", "# set by the host"} {
		if !bytes.Contains(raw, []byte(c)) {
			t.Errorf("comment %q lost:\n%s", c, raw)
		}
	}
	if got := listSkillFiles(t, h.Dir); !reflect.DeepEqual(got, filesBefore) {
		t.Errorf("skill files changed: %d now, %d before", len(got), len(filesBefore))
	}
	if now, _ := os.ReadFile(filepath.Join(sk, ".usage.json")); !bytes.Equal(now, sidecar) {
		t.Error("the cap wrote Hermes' usage sidecar")
	}

	set, err := h.Skills(nil)
	if err != nil {
		t.Fatal(err)
	}
	off := 0
	for _, s := range set.Skills {
		if s.Disabled {
			off++
		}
	}
	if off != 5 || len(set.Skills) != 46 {
		t.Errorf("%d of %d skills read back disabled", off, len(set.Skills))
	}

	before, _ := os.Stat(filepath.Join(h.Dir, "config.yaml"))
	again, err := h.EnforceSkillCap(context.Background(), 40, nil)
	if err != nil || len(again.Disabled) != 0 || len(again.AlreadyDisabled) != 5 || again.Enabled != 40 {
		t.Fatalf("second run = %+v, %v", again, err)
	}
	after, _ := os.Stat(filepath.Join(h.Dir, "config.yaml"))
	if now, _ := os.ReadFile(filepath.Join(h.Dir, "config.yaml")); !os.SameFile(before, after) || !bytes.Equal(now, raw) {
		t.Error("second run rewrote config.yaml")
	}
}
