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
	Category    string // the folders above the skill's own (see skillCategory), e.g. "mlops/inference"; empty for skills/<name>/
	Dir         string // folder of the skill, relative to its skills root, e.g. "mlops/inference/vllm"
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

// BrokenSkill is a SKILL.md that Hermes would not load as written, or a folder of the tree
// the host could not or would not read (a link out of the home, a loop, past the walk's
// bounds, a folder of files with no SKILL.md), and why.
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
	Categories []Category // of the home and the bundled tree, one per Dir, sorted
	Broken     []BrokenSkill
	Duplicates []DuplicateSkill
}

// Bundled is the image's bundled skills, read once per process: they are the same for
// every org and never copied into a home.
type Bundled struct {
	Dir        string
	Skills     []Skill
	Categories []Category
	Broken     []BrokenSkill
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
	b.Skills, b.Broken, b.Categories, err = readSkillTree(tree, ".")
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
	authored, broken, categories, err := h.homeSkills()
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
		categories = append(append([]Category(nil), categories...), bundled.Categories...)
	}
	set.Categories = mergeCategories(categories)
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

// mergeCategories keeps one category per folder, the home's first: where both trees have
// one, Hermes takes the home's description and falls back to the external tree's.
func mergeCategories(all []Category) []Category {
	byDir := map[string]int{}
	var out []Category
	for _, c := range all {
		if i, ok := byDir[c.Dir]; ok {
			if out[i].Description == "" {
				out[i].Description = c.Description
			}
			continue
		}
		byDir[c.Dir] = len(out)
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Dir < out[j].Dir })
	return out
}

// homeSkills reads the home's skills/ folder, marking what Hermes marks as not the home's
// own: skills seeded from a bundle and skills installed from the Skills Hub.
func (h *Home) homeSkills() ([]Skill, []BrokenSkill, []Category, error) {
	if _, err := h.Stat(skillsDir); errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil, nil
	} else if err != nil {
		return nil, nil, nil, fmt.Errorf("read skills: %w", err)
	}
	skills, broken, categories, err := readSkillTree(h, skillsDir)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("read skills of org %s: %w", h.ID, err)
	}
	upstream := h.upstreamSkills()
	for i := range skills {
		skills[i].Source = SkillAuthored
		if src, ok := upstream[skills[i].Name]; ok {
			skills[i].Source = src
		}
	}
	return skills, broken, categories, nil
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

// skipSkillDir says whether a folder is never walked for skills. Hermes prunes the names in
// EXCLUDED_SKILL_DIRS (agent/skill_utils.py: .git, .github, .hub, .archive, .venv, venv,
// node_modules, site-packages, __pycache__, .tox, .nox and the tool caches); every one of them
// is covered here. This reader skips more: every hidden folder, and every "_" folder, of which
// _org/ is Hermes' token-gated org mirror, shared and not the org's own.
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

// skillSupportDirs are a skill's progressive-disclosure folders. Hermes does not walk them
// when they sit directly in a folder holding SKILL.md (SKILL_SUPPORT_DIRS in
// agent/skill_utils.py): a SKILL.md kept in references/ is data, not a skill. The same names
// elsewhere (skills/scripts/foo) are ordinary folders.
var skillSupportDirs = map[string]bool{"references": true, "templates": true, "assets": true, "scripts": true}

// Bounds of one walk. Hermes has none, but a home is the agent's to write, and a link that
// loops or a million folders must not keep the host walking. Hermes' own deepest skills are
// three folders down (mlops/inference/vllm).
const (
	maxSkillTreeDepth   = 10     // folders below the skills root
	maxSkillTreeEntries = 10_000 // directory entries listed in one tree
	maxDescriptionBytes = 64 << 10
)

// Category is a folder that groups skills: it has no SKILL.md of its own, and holds a
// DESCRIPTION.md or skills below it (Hermes' skills index lists it with that description).
type Category struct {
	Dir         string // relative to its skills root, e.g. "mlops/inference"; what Skill.Category holds
	Description string // from DESCRIPTION.md's frontmatter; empty without one
}

// skillCategory is Hermes' category of the skill at dir: the folders between the skills root
// and the skill's own, so mlops/inference/vllm is in "mlops/inference". This is the rule of
// its system-prompt skills index (agent/prompt_builder.py, _build_snapshot_entry), whose
// categories are the keys DESCRIPTION.md files are read under; its skills_list tool reports
// only the first folder ("mlops"). A skill directly under the root has no category here (the
// index files it under its own name, skills_list under none).
func skillCategory(dir string) string {
	if i := strings.LastIndexByte(dir, '/'); i >= 0 {
		return dir[:i]
	}
	return ""
}

// readSkillTree finds every SKILL.md below base at any depth, as Hermes does
// (iter_skill_index_files in agent/skill_utils.py walks the whole tree, following links),
// and reports the categories found and the folders that look like skills but are not.
func readSkillTree(t *Home, base string) ([]Skill, []BrokenSkill, []Category, error) {
	return walkSkillTree(t, base, maxSkillTreeEntries)
}

// walkSkillTree is readSkillTree listing at most limit directory entries.
func walkSkillTree(t *Home, base string, limit int) ([]Skill, []BrokenSkill, []Category, error) {
	rootInfo, err := t.Stat(base)
	if err != nil {
		return nil, nil, nil, err
	}
	list, err := t.ReadDir(base)
	if err != nil {
		return nil, nil, nil, err
	}
	w := &skillWalk{t: t, base: base, limit: limit}
	w.folder(".", list, 0, false, []fs.FileInfo{rootInfo})
	sort.Slice(w.categories, func(i, j int) bool { return w.categories[i].Dir < w.categories[j].Dir })
	return w.skills, w.broken, w.categories, nil
}

// skillWalk is the state of one readSkillTree.
type skillWalk struct {
	t          *Home
	base       string
	limit      int // of entries listed
	entries    int
	stopped    bool
	skills     []Skill
	broken     []BrokenSkill
	categories []Category
}

// folder reads one listed folder (rel to the root, "." for the root itself) and the folders
// below it; inSkill is whether a folder above holds SKILL.md, and above are the folders on
// the way down, to catch links that loop. It says whether the folder or one below holds a
// skill.
func (w *skillWalk) folder(rel string, list []fs.DirEntry, depth int, inSkill bool, above []fs.FileInfo) bool {
	if w.stopped {
		return false
	}
	w.entries += len(list)
	if w.entries > w.limit {
		w.stopped = true
		w.broken = append(w.broken, BrokenSkill{Dir: rel, Reason: fmt.Sprintf(
			"the skills tree has over %d entries: the walk stopped here, and what is below or after was not read", w.limit)})
		return false
	}
	var hasSkillMD, hasDescription, hasFiles bool
	for _, e := range list {
		switch {
		case e.IsDir():
		case e.Name() == "SKILL.md":
			hasSkillMD = true
		case e.Name() == "DESCRIPTION.md":
			hasDescription = true
		case e.Type().IsRegular() && !strings.HasPrefix(e.Name(), "."):
			hasFiles = true // links are not counted: each is reported or walked on its own
		}
	}
	// The root's own SKILL.md or DESCRIPTION.md would name no skill or category.
	isSkill := rel != "." && hasSkillMD
	if isSkill {
		sk, problem, found := readSkill(w.t, w.base, rel, skillCategory(rel))
		switch {
		case !found:
			isSkill = false // gone since it was listed
		case problem != "":
			w.broken = append(w.broken, BrokenSkill{Dir: rel, Reason: problem})
		default:
			w.skills = append(w.skills, sk)
		}
	}
	below := false
	for _, e := range list {
		name := e.Name()
		if skipSkillDir(name) || (isSkill && skillSupportDirs[name]) {
			continue
		}
		child := path.Join(rel, name)
		full := path.Join(w.base, child)
		fi, isDir, problem := w.kind(e, full)
		if problem != "" {
			w.broken = append(w.broken, BrokenSkill{Dir: child, Reason: problem})
			continue
		}
		if !isDir {
			continue
		}
		if depth+1 > maxSkillTreeDepth {
			w.broken = append(w.broken, BrokenSkill{Dir: child, Reason: fmt.Sprintf("more than %d folders deep; not read", maxSkillTreeDepth)})
			continue
		}
		if loops(fi, above) {
			w.broken = append(w.broken, BrokenSkill{Dir: child, Reason: "links back to a folder above it (a loop); not read"})
			continue
		}
		inner, err := w.t.ReadDir(full)
		if err != nil {
			w.broken = append(w.broken, BrokenSkill{Dir: child, Reason: describeReadError(err)})
			continue
		}
		if w.folder(child, inner, depth+1, inSkill || isSkill, append(above[:len(above):len(above)], fi)) {
			below = true
		}
		if w.stopped {
			break
		}
	}
	switch {
	case rel == "." || isSkill:
	case hasDescription || below:
		w.categories = append(w.categories, Category{Dir: rel, Description: w.categoryDescription(rel)})
	case hasFiles && !inSkill && !w.stopped:
		// Hermes skips such a folder without a word. Files, but no SKILL.md, no DESCRIPTION.md
		// and no skill below, outside any skill: a skill whose SKILL.md is missing or misnamed,
		// which the operator should hear of. Empty folders and a skill's own subfolders are not.
		w.broken = append(w.broken, BrokenSkill{Dir: rel, Reason: "no SKILL.md"})
	}
	return isSkill || below
}

// kind says whether an entry is a folder to walk. A symlink is followed through the home's
// os.Root, as Hermes follows links; one that leaves the home is reported and not read, and a
// dangling one is a file to Hermes' walk.
func (w *skillWalk) kind(e fs.DirEntry, full string) (fs.FileInfo, bool, string) {
	if e.Type()&fs.ModeSymlink == 0 {
		if !e.IsDir() {
			return nil, false, ""
		}
		fi, err := e.Info()
		if err != nil {
			return nil, false, describeReadError(err)
		}
		return fi, true, ""
	}
	fi, err := w.t.Stat(full)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, false, ""
	case err != nil:
		return nil, false, describeReadError(err)
	}
	return fi, fi.IsDir(), ""
}

func loops(fi fs.FileInfo, above []fs.FileInfo) bool {
	for _, a := range above {
		if os.SameFile(fi, a) {
			return true
		}
	}
	return false
}

// categoryDescription is the description of DESCRIPTION.md's frontmatter, as Hermes reads it
// (_read_category_descriptions in agent/prompt_builder.py); a missing or unreadable file is
// none, as it is for Hermes.
func (w *skillWalk) categoryDescription(rel string) string {
	raw, _, _, err := w.t.readLimited(path.Join(w.base, rel, "DESCRIPTION.md"), maxDescriptionBytes)
	if err != nil {
		return ""
	}
	fm, problem := parseFrontmatter(raw)
	if problem != "" {
		return ""
	}
	return strings.Trim(strings.TrimSpace(fm.Description), `'"`)
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
