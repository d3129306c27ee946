package orghome

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"

	"go.yaml.in/yaml/v3"
)

// NoBundledSkillsFile stops Hermes copying its bundled skills into the home at every start;
// the image's set is read in place through skills.external_dirs instead.
const NoBundledSkillsFile = ".no-bundled-skills"

// pluginsDir is where Hermes looks for user plugins, one folder each.
const pluginsDir = "plugins"

// AgentSetup is what a home must say before Hermes starts in it: the real CLI takes its
// model endpoint from config.yaml only (it ignores OPENAI_BASE_URL), so the gateway is
// written there as a provider, with the key left in the environment under KeyEnv.
type AgentSetup struct {
	Provider string // the provider's name in config.yaml
	BaseURL  string // the gateway's /v1, as the agent reaches it
	Model    string
	KeyEnv   string // the variable of the agent's environment that holds the org's gateway key
	// BundledSkills is the image's read-only bundled skills tree (HERMES_BUNDLED_SKILLS);
	// empty for none.
	BundledSkills string
	Plugin        Plugin
}

// Plugin is a Hermes user plugin to install under plugins/<Name>/ and enable.
type Plugin struct {
	Name  string
	Files map[string][]byte // path inside the plugin folder -> content
}

// SetupResult says what EnsureAgentSetup changed.
type SetupResult struct {
	ConfigWritten   bool
	PluginFiles     []string // written, because they were missing or different
	NoBundledSkills bool     // .no-bundled-skills was created
}

var (
	keyEnvPattern     = regexp.MustCompile(`^[A-Z_][A-Z0-9_]{0,63}$`)
	pluginNamePattern = regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`)
)

func (s AgentSetup) check() error {
	switch {
	case s.Provider == "" || !skillNamePattern.MatchString(s.Provider):
		return fmt.Errorf("agent setup: provider name %q is not lowercase letters, digits and hyphens", s.Provider)
	case s.BaseURL == "":
		return errors.New("agent setup: no gateway base URL")
	case s.Model == "":
		return errors.New("agent setup: no model")
	case !keyEnvPattern.MatchString(s.KeyEnv):
		return fmt.Errorf("agent setup: key variable %q is not an environment variable name", s.KeyEnv)
	case s.Plugin.Name != "" && !pluginNamePattern.MatchString(s.Plugin.Name):
		return fmt.Errorf("agent setup: plugin name %q is not a Python package name", s.Plugin.Name)
	}
	for name := range s.Plugin.Files {
		if err := CheckPath(name); err != nil {
			return fmt.Errorf("agent setup: plugin file %q: %w", name, err)
		}
	}
	return nil
}

// EnsureAgentSetup makes the home one the real Hermes CLI runs in unchanged, before every
// agent start: config.yaml names the gateway as the model provider (the key stays in the
// environment; the file holds only its variable's name), turns off the offline start-up
// scanner (security.tirith_enabled: false), reads the bundled skills in place
// (skills.external_dirs) and enables the host's plugin (plugins.enabled); the plugin's files
// are installed; .no-bundled-skills stops Hermes copying its bundled skills in.
//
// Every other key, comment and the order of config.yaml are kept, and the file is written
// only when a value the host owns differs, atomically with a receipt. A config.yaml that
// does not parse is a *ConfigError naming the file and line, and the home is left as it was.
func (h *Home) EnsureAgentSetup(s AgentSetup) (SetupResult, error) {
	var res SetupResult
	if err := s.check(); err != nil {
		return res, err
	}
	cfg, err := h.readConfig()
	if err != nil {
		return res, err
	}
	changed := cfg.ensureAgent(s)
	if changed {
		data, err := cfg.encode()
		if err != nil {
			return res, err
		}
		if err := h.writeOwned(configFile, data, 0o600, cfg.exists); err != nil {
			return res, fmt.Errorf("agent setup of org %s: %w", h.ID, err)
		}
		res.ConfigWritten = true
	}
	if s.Plugin.Name != "" {
		if res.PluginFiles, err = h.installPlugin(s.Plugin); err != nil {
			return res, err
		}
	}
	if _, err := h.Lstat(NoBundledSkillsFile); errors.Is(err, fs.ErrNotExist) {
		if err := h.writeOwned(NoBundledSkillsFile, nil, 0o600, false); err != nil {
			return res, fmt.Errorf("agent setup of org %s: %w", h.ID, err)
		}
		res.NoBundledSkills = true
	} else if err != nil {
		return res, fmt.Errorf("agent setup of org %s: %w", h.ID, err)
	}
	if res.ConfigWritten || len(res.PluginFiles) > 0 || res.NoBundledSkills {
		h.Log.Info("agent setup written", "org", h.ID, "config", res.ConfigWritten,
			"plugin_files", res.PluginFiles, "no_bundled_skills", res.NoBundledSkills)
	}
	return res, nil
}

// installPlugin writes the plugin's files that are missing or differ. Each write is atomic,
// so Hermes starting meanwhile sees the old file or the new one, never a part.
func (h *Home) installPlugin(p Plugin) ([]string, error) {
	dir := path.Join(pluginsDir, p.Name)
	names := make([]string, 0, len(p.Files))
	for name := range p.Files {
		names = append(names, name)
	}
	sort.Strings(names)
	var written []string
	for _, name := range names {
		rel := path.Join(dir, name)
		if err := h.mkdirs(path.Dir(rel)); err != nil {
			return written, err
		}
		old, more, _, err := h.readLimited(rel, int64(len(p.Files[name])))
		if err == nil && !more && bytes.Equal(old, p.Files[name]) {
			continue
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			// A folder or a link where a file should be: replaced below, never followed.
			h.Log.Warn("plugin file unreadable; replacing it", "org", h.ID, "file", rel, "err", err)
		}
		if err := h.writeOwned(rel, p.Files[name], 0o644, false); err != nil {
			return written, fmt.Errorf("install plugin %s in home of org %s: %w", p.Name, h.ID, err)
		}
		written = append(written, rel)
	}
	return written, nil
}

// mkdirs makes dir and its parents inside the home, refusing links on the way.
func (h *Home) mkdirs(dir string) error {
	if err := CheckPath(dir); err != nil {
		return fmt.Errorf("make folder in home of org %s: %w", h.ID, err)
	}
	if err := h.root.MkdirAll(dir, 0o700); err != nil {
		return h.wrapPath("make folder", dir, err)
	}
	return h.realDir(dir)
}

// ensureAgent sets the values the host owns and reports whether anything changed.
func (c *hermesConfig) ensureAgent(s AgentSetup) bool {
	top := c.doc.Content[0]
	changed := false
	model, ch := mappingFor(top, "model")
	changed = changed || ch
	// An endpoint or a key written into the model block itself would send the agent past
	// the provider (and a key does not belong in a file): the provider block says both.
	changed = deleteKey(model, "base_url") || changed
	changed = deleteKey(model, "api_key") || changed
	changed = setScalar(model, "provider", s.Provider) || changed
	changed = setScalar(model, "default", s.Model) || changed

	providers, ch := mappingFor(top, "providers")
	changed = changed || ch
	provider, ch := mappingFor(providers, s.Provider)
	changed = changed || ch
	changed = deleteKey(provider, "api_key") || changed
	changed = setScalar(provider, "base_url", s.BaseURL) || changed
	changed = setScalar(provider, "key_env", s.KeyEnv) || changed
	changed = setScalar(provider, "default_model", s.Model) || changed

	security, ch := mappingFor(top, "security")
	changed = changed || ch
	changed = setBool(security, "tirith_enabled", false) || changed

	if s.BundledSkills != "" {
		skills, ch := mappingFor(top, "skills")
		changed = changed || ch
		changed = addToList(skills, "external_dirs", s.BundledSkills) || changed
	}
	if s.Plugin.Name != "" {
		plugins, ch := mappingFor(top, "plugins")
		changed = changed || ch
		changed = addToList(plugins, "enabled", s.Plugin.Name) || changed
	}
	return changed
}

// mappingFor is mappingAt that also says whether it had to create or replace the mapping.
func mappingFor(m *yaml.Node, key string) (*yaml.Node, bool) {
	if v := valueOf(m, key); v != nil && v.Kind == yaml.MappingNode {
		return v, false
	}
	return mappingAt(m, key), true
}

func valueOf(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

func deleteKey(m *yaml.Node, key string) bool {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			m.Content = append(m.Content[:i], m.Content[i+2:]...)
			return true
		}
	}
	return false
}

func setScalar(m *yaml.Node, key, value string) bool {
	if v := valueOf(m, key); v != nil && v.Kind == yaml.ScalarNode && v.Tag != "!!null" && v.Value == value {
		return false
	}
	setKey(m, key, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: value})
	return true
}

func setBool(m *yaml.Node, key string, value bool) bool {
	want := "false"
	if value {
		want = "true"
	}
	if v := valueOf(m, key); v != nil && v.Kind == yaml.ScalarNode && v.Tag == "!!bool" {
		var b bool
		if v.Decode(&b) == nil && b == value {
			return false
		}
	}
	setKey(m, key, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: want})
	return true
}

// addToList makes the value under key a list holding item, keeping what it held: a lone
// string becomes the first entry.
func addToList(m *yaml.Node, key, item string) bool {
	v := valueOf(m, key)
	switch {
	case v != nil && v.Kind == yaml.SequenceNode:
		for _, e := range v.Content {
			if e.Kind == yaml.ScalarNode && e.Value == item {
				return false
			}
		}
		v.Content = append(v.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: item})
		return true
	case v != nil && v.Kind == yaml.ScalarNode && v.Tag != "!!null" && v.Value != "":
		if v.Value == item {
			setKey(m, key, &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Content: []*yaml.Node{
				{Kind: yaml.ScalarNode, Tag: "!!str", Value: item}}})
			return true
		}
		setKey(m, key, &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Content: []*yaml.Node{
			{Kind: yaml.ScalarNode, Tag: "!!str", Value: v.Value}, {Kind: yaml.ScalarNode, Tag: "!!str", Value: item}}})
		return true
	}
	setKey(m, key, &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Content: []*yaml.Node{
		{Kind: yaml.ScalarNode, Tag: "!!str", Value: item}}})
	return true
}
