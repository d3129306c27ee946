package orghome

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"regexp"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// Hermes' limits for a skill (tools/skill_manager_tool.py). Hermes' own name pattern also
// admits dots and underscores, so this reader does too: a skill Hermes loads is not
// reported broken here.
const (
	MaxSkillNameLen        = 64
	MaxSkillDescriptionLen = 1024
	MaxSkillFileChars      = 100_000
)

var skillNamePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)

// skillsDir is where a home keeps its skills; the image's bundled skills have the same shape.
const skillsDir = "skills"

// Skill is one SKILL.md that parsed and passed Hermes' limits.
type Skill struct {
	Name        string
	Description string
	Version     string
	Metadata    map[string]any
	Category    string // the folder above the skill's own; empty for skills/<name>/SKILL.md
	Dir         string // folder of the skill, relative to its skills root, e.g. "research/arxiv"
	Chars       int
	ModTime     time.Time // of SKILL.md
	Source      string    // SkillAuthored, SkillHub, SkillSeeded or SkillBundled
	Disabled    bool      // named in config.yaml's skills.disabled
}

// Where a skill comes from. Only authored skills count toward the cap: the others are
// maintained upstream, and Hermes' own curator leaves them alone for the same reason.
const (
	SkillAuthored = "authored" // written in the home, by the agent or a person
	SkillHub      = "hub"      // installed from the Skills Hub (skills/.hub/lock.json)
	SkillSeeded   = "seeded"   // copied into the home from a bundle (skills/.bundled_manifest)
	SkillBundled  = "bundled"  // the image's, read-only, shared by every org
)

// BrokenSkill is a SKILL.md that Hermes would not load as written, and why.
type BrokenSkill struct {
	Dir     string
	Bundled bool
	Reason  string
}

// DuplicateSkill is a name claimed by more than one skill folder. Hermes resolves the
// clash one way; the operator should resolve it for real.
type DuplicateSkill struct {
	Name string
	Dirs []string // "bundled:" marks a folder of the image
}

// SkillSet is every skill of a home, authored and bundled, plus what is wrong with them.
type SkillSet struct {
	Skills     []Skill
	Broken     []BrokenSkill
	Duplicates []DuplicateSkill
}

// Bundled is the image's bundled skills, read once per process: they are the same for
// every org and never copied into a home.
type Bundled struct {
	Dir    string
	Skills []Skill
	Broken []BrokenSkill
}

// ReadBundled reads the bundled skills under dir (HERMES_BUNDLED_SKILLS). A missing folder
// is an image without bundled skills.
func ReadBundled(dir string) (*Bundled, error) {
	b := &Bundled{Dir: dir}
	root, err := os.OpenRoot(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return b, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read bundled skills: %w", err)
	}
	defer root.Close()
	// The image's folder is read with the same os.Root guard as a home.
	tree := &Home{ID: "bundled", Dir: dir, root: root}
	b.Skills, b.Broken, err = readSkillTree(tree, ".")
	if err != nil {
		return nil, fmt.Errorf("read bundled skills in %s: %w", dir, err)
	}
	for i := range b.Skills {
		b.Skills[i].Source = SkillBundled
	}
	for i := range b.Broken {
		b.Broken[i].Bundled = true
	}
	return b, nil
}

func (b *Bundled) names() map[string]bool {
	out := map[string]bool{}
	if b == nil {
		return out
	}
	for _, s := range b.Skills {
		out[s.Name] = true
	}
	return out
}

// Skills reads the home's skills and merges the bundled ones (nil for none), marking the
// ones config.yaml disables and reporting broken skills and duplicate names.
func (h *Home) Skills(bundled *Bundled) (SkillSet, error) {
	var set SkillSet
	authored, broken, err := h.homeSkills()
	if err != nil {
		return SkillSet{}, err
	}
	cfg, err := h.readConfig()
	if err != nil {
		return SkillSet{}, err
	}
	disabled := cfg.disabledSkills()
	set.Broken = broken
	all := authored
	if bundled != nil {
		all = append(append([]Skill(nil), authored...), bundled.Skills...)
		set.Broken = append(set.Broken, bundled.Broken...)
	}
	byName := map[string][]string{}
	for i := range all {
		all[i].Disabled = disabled[all[i].Name]
		dir := all[i].Dir
		if all[i].Source == SkillBundled {
			dir = "bundled:" + dir
		}
		byName[all[i].Name] = append(byName[all[i].Name], dir)
	}
	set.Skills = all
	for name, dirs := range byName {
		if len(dirs) > 1 {
			set.Duplicates = append(set.Duplicates, DuplicateSkill{Name: name, Dirs: dirs})
		}
	}
	sort.Slice(set.Skills, func(i, j int) bool {
		a, b := set.Skills[i], set.Skills[j]
		if a.Name != b.Name {
			return a.Name < b.Name
		}
		return a.Source != SkillBundled && b.Source == SkillBundled
	})
	sort.Slice(set.Duplicates, func(i, j int) bool { return set.Duplicates[i].Name < set.Duplicates[j].Name })
	sort.Slice(set.Broken, func(i, j int) bool { return set.Broken[i].Dir < set.Broken[j].Dir })
	return set, nil
}

// homeSkills reads the home's skills/ folder, marking what Hermes marks as not the home's
// own: skills seeded from a bundle and skills installed from the Skills Hub.
func (h *Home) homeSkills() ([]Skill, []BrokenSkill, error) {
	if _, err := h.Stat(skillsDir); errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	} else if err != nil {
		return nil, nil, fmt.Errorf("read skills: %w", err)
	}
	skills, broken, err := readSkillTree(h, skillsDir)
	if err != nil {
		return nil, nil, fmt.Errorf("read skills of org %s: %w", h.ID, err)
	}
	upstream := h.upstreamSkills()
	for i := range skills {
		skills[i].Source = SkillAuthored
		if src, ok := upstream[skills[i].Name]; ok {
			skills[i].Source = src
		}
	}
	return skills, broken, nil
}

// upstreamSkills is Hermes' provenance rule (tools/skill_usage.py): a skill named in
// .bundled_manifest ("name:hash" lines) or in .hub/lock.json's "installed" is not the
// agent's own. Unreadable files count as empty, as in Hermes.
func (h *Home) upstreamSkills() map[string]string {
	out := map[string]string{}
	if raw, _, _, err := h.readLimited(skillsDir+"/.bundled_manifest", 1<<20); err == nil {
		for _, line := range strings.Split(string(raw), "\n") {
			name, _, _ := strings.Cut(strings.TrimSpace(line), ":")
			if name = strings.TrimSpace(name); name != "" {
				out[name] = SkillSeeded
			}
		}
	}
	if raw, _, _, err := h.readLimited(skillsDir+"/.hub/lock.json", 4<<20); err == nil {
		var lock struct {
			Installed map[string]any `json:"installed"`
		}
		if json.Unmarshal(raw, &lock) == nil {
			for name := range lock.Installed {
				out[name] = SkillHub
			}
		}
	}
	return out
}

// skipSkillDir says whether a folder is never a skill or category: Hermes' own hidden
// folders (.hub, .archive, ...) and the org-mirror folder, dependency and cache folders.
func skipSkillDir(name string) bool {
	if strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
		return true
	}
	switch name {
	case "node_modules", "venv", "site-packages", "__pycache__":
		return true
	}
	return false
}

// readSkillTree reads <base>/<name>/SKILL.md and <base>/<category>/<name>/SKILL.md.
func readSkillTree(t *Home, base string) ([]Skill, []BrokenSkill, error) {
	top, err := t.ReadDir(base)
	if err != nil {
		return nil, nil, err
	}
	var (
		skills []Skill
		broken []BrokenSkill
	)
	visit := func(rel, category string) bool {
		sk, problem, found := readSkill(t, base, rel, category)
		switch {
		case !found:
			return false
		case problem != "":
			broken = append(broken, BrokenSkill{Dir: rel, Reason: problem})
		default:
			skills = append(skills, sk)
		}
		return true
	}
	for _, e := range top {
		if skipSkillDir(e.Name()) || (!e.IsDir() && e.Type()&fs.ModeSymlink == 0) {
			continue
		}
		if visit(e.Name(), "") {
			continue
		}
		inner, err := t.ReadDir(path.Join(base, e.Name()))
		if err != nil {
			broken = append(broken, BrokenSkill{Dir: e.Name(), Reason: describeReadError(err)})
			continue
		}
		for _, s := range inner {
			if skipSkillDir(s.Name()) || (!s.IsDir() && s.Type()&fs.ModeSymlink == 0) {
				continue
			}
			if !visit(e.Name()+"/"+s.Name(), e.Name()) {
				broken = append(broken, BrokenSkill{Dir: e.Name() + "/" + s.Name(), Reason: "no SKILL.md"})
			}
		}
	}
	return skills, broken, nil
}

func describeReadError(err error) string {
	if errors.Is(err, ErrOutsideHome) {
		return "points outside the home (symlink); not read"
	}
	return err.Error()
}

// readSkill reads one candidate skill folder. found is false when it has no SKILL.md (it
// may be a category); problem is why Hermes would not load a SKILL.md that is there.
func readSkill(t *Home, base, rel, category string) (sk Skill, problem string, found bool) {
	// Hermes counts characters; four bytes a character is the most UTF-8 needs.
	raw, more, fi, err := t.readLimited(path.Join(base, rel, "SKILL.md"), 4*MaxSkillFileChars)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return Skill{}, "", false
	case err != nil:
		return Skill{}, describeReadError(err), true
	case more:
		return Skill{}, fmt.Sprintf("SKILL.md is over Hermes' limit of %d characters", MaxSkillFileChars), true
	case !utf8.Valid(raw):
		return Skill{}, "SKILL.md is not UTF-8 text", true
	}
	chars := utf8.RuneCount(raw)
	if chars > MaxSkillFileChars {
		return Skill{}, fmt.Sprintf("SKILL.md is %d characters, over Hermes' limit of %d characters", chars, MaxSkillFileChars), true
	}
	fm, problem := parseFrontmatter(raw)
	if problem != "" {
		return Skill{}, problem, true
	}
	dirName := path.Base(rel)
	switch {
	case fm.Name == "":
		return Skill{}, "frontmatter has no name", true
	case utf8.RuneCountInString(fm.Name) > MaxSkillNameLen:
		return Skill{}, fmt.Sprintf("name is over %d characters", MaxSkillNameLen), true
	case !skillNamePattern.MatchString(fm.Name):
		return Skill{}, fmt.Sprintf("name %q is not lowercase letters, digits, hyphens, dots or underscores", fm.Name), true
	case fm.Name != dirName:
		return Skill{}, fmt.Sprintf("name %q does not match its folder %q", fm.Name, dirName), true
	case strings.TrimSpace(fm.Description) == "":
		return Skill{}, "frontmatter has no description", true
	case utf8.RuneCountInString(fm.Description) > MaxSkillDescriptionLen:
		return Skill{}, fmt.Sprintf("description is over %d characters", MaxSkillDescriptionLen), true
	}
	return Skill{
		Name:        fm.Name,
		Description: fm.Description,
		Version:     fm.Version,
		Metadata:    fm.Metadata,
		Category:    category,
		Dir:         rel,
		Chars:       chars,
		ModTime:     fi.ModTime(),
	}, "", true
}

type frontmatter struct {
	Name        string         `yaml:"name"`
	Description string         `yaml:"description"`
	Version     string         `yaml:"version"`
	Metadata    map[string]any `yaml:"metadata"`
}

// frontmatterEnd is Hermes' closing fence: a line of "---" (agent/skill_utils.py).
var frontmatterEnd = regexp.MustCompile(`\n---\s*\n`)

// parseFrontmatter reads the YAML between the opening "---" and the closing fence, after
// a leading byte-order mark, as Hermes does.
func parseFrontmatter(raw []byte) (frontmatter, string) {
	raw = bytes.TrimPrefix(raw, []byte("\ufeff"))
	if !bytes.HasPrefix(raw, []byte("---")) {
		return frontmatter{}, "SKILL.md does not start with YAML frontmatter (---)"
	}
	loc := frontmatterEnd.FindIndex(raw[3:])
	if loc == nil {
		return frontmatter{}, "frontmatter has no closing ---"
	}
	var node yaml.Node
	if err := yaml.Unmarshal(raw[3:3+loc[0]], &node); err != nil {
		return frontmatter{}, "frontmatter is not valid YAML: " + err.Error()
	}
	if len(node.Content) == 0 || node.Content[0].Kind != yaml.MappingNode {
		return frontmatter{}, "frontmatter is not a mapping of fields"
	}
	var fm frontmatter
	if err := node.Decode(&fm); err != nil {
		return frontmatter{}, "frontmatter fields have the wrong types: " + err.Error()
	}
	return fm, ""
}
