package orghome

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// configFile is Hermes' settings file in the home.
const configFile = "config.yaml"

// configReadLimit bounds the read of config.yaml; Hermes' own is a few kilobytes.
const configReadLimit = 1 << 20

// ConfigError is a config.yaml the host cannot read as Hermes settings. The host writes
// nothing over such a file: the settings in it are a person's, and only they can mend it.
type ConfigError struct {
	File string // the file's path
	Line int    // 1-based; 0 when the parser named none
	Msg  string
}

func (e *ConfigError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("%s line %d: %s (Hermes settings the host cannot read; nothing was written over them)", e.File, e.Line, e.Msg)
	}
	return fmt.Sprintf("%s: %s (Hermes settings the host cannot read; nothing was written over them)", e.File, e.Msg)
}

// yamlLine is how go-yaml names the line of a syntax error: "yaml: line 3: ...".
var yamlLine = regexp.MustCompile(`^yaml: line (\d+): `)

func newConfigError(file string, err error) *ConfigError {
	msg := err.Error()
	e := &ConfigError{File: file, Msg: "not valid YAML: " + strings.TrimPrefix(msg, "yaml: ")}
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		e.Line, _ = strconv.Atoi(m[1])
		e.Msg = "not valid YAML: " + msg[len(m[0]):]
	}
	return e
}

// hermesConfig is config.yaml as a YAML node tree, so a change to one key writes every
// other key, comment and ordering back as it was.
type hermesConfig struct {
	exists bool
	raw    []byte
	doc    *yaml.Node // a DocumentNode holding a MappingNode
}

// readConfig reads config.yaml. A missing file is an empty configuration; a file that is
// not YAML is an error, never treated as empty (writing over it would lose the settings).
func (h *Home) readConfig() (*hermesConfig, error) {
	raw, more, _, err := h.readLimited(configFile, configReadLimit)
	if errors.Is(err, fs.ErrNotExist) {
		return &hermesConfig{doc: &yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{{Kind: yaml.MappingNode, Tag: "!!map"}}}}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read Hermes config: %w", err)
	}
	if more {
		return nil, fmt.Errorf("read Hermes config of org %s: config.yaml is over %d bytes", h.ID, configReadLimit)
	}
	c := &hermesConfig{exists: true, raw: raw, doc: &yaml.Node{}}
	if err := yaml.Unmarshal(raw, c.doc); err != nil {
		return nil, newConfigError(filepath.Join(h.Dir, configFile), err)
	}
	if c.doc.Kind == 0 { // an empty file
		c.doc = &yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{{Kind: yaml.MappingNode, Tag: "!!map"}}}
	}
	if c.doc.Kind != yaml.DocumentNode || len(c.doc.Content) != 1 || c.doc.Content[0].Kind != yaml.MappingNode {
		return nil, &ConfigError{File: filepath.Join(h.Dir, configFile), Line: 1, Msg: "not a mapping of settings"}
	}
	return c, nil
}

// lookup finds the value node at a key path of mappings, or nil.
func (c *hermesConfig) lookup(path ...string) *yaml.Node {
	n := c.doc.Content[0]
	for _, key := range path {
		if n.Kind != yaml.MappingNode {
			return nil
		}
		var next *yaml.Node
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == key {
				next = n.Content[i+1]
			}
		}
		if next == nil {
			return nil
		}
		n = next
	}
	return n
}

func (c *hermesConfig) intAt(path ...string) (int, bool) {
	n := c.lookup(path...)
	if n == nil || n.Kind != yaml.ScalarNode {
		return 0, false
	}
	v, err := strconv.Atoi(n.Value)
	if err != nil || v <= 0 {
		return 0, false
	}
	return v, true
}

// disabledSkills reads skills.disabled the way Hermes does (agent/skill_utils.py,
// get_disabled_skill_names): a list of names, a lone string is one name, and a string
// holding a JSON-style list (what `hermes config set` writes) is that list.
func (c *hermesConfig) disabledSkills() map[string]bool {
	out := map[string]bool{}
	n := c.lookup("skills", "disabled")
	if n == nil {
		return out
	}
	add := func(s string) {
		if s = strings.TrimSpace(s); s != "" {
			out[s] = true
		}
	}
	switch n.Kind {
	case yaml.SequenceNode:
		for _, item := range n.Content {
			if item.Kind == yaml.ScalarNode {
				add(item.Value)
			}
		}
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return out
		}
		v := strings.TrimSpace(n.Value)
		if strings.HasPrefix(v, "[") {
			var list []string
			if yaml.Unmarshal([]byte(v), &list) == nil {
				for _, s := range list {
					add(s)
				}
				return out
			}
		}
		add(v)
	}
	return out
}

// setDisabledSkills writes skills.disabled as a sorted list of names, creating the skills
// mapping when missing and keeping every other key of it.
func (c *hermesConfig) setDisabledSkills(names map[string]bool) {
	list := make([]string, 0, len(names))
	for n := range names {
		list = append(list, n)
	}
	sort.Strings(list)
	seq := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
	for _, n := range list {
		seq.Content = append(seq.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: n})
	}
	skills := mappingAt(c.doc.Content[0], "skills")
	setKey(skills, "disabled", seq)
}

// mappingAt returns the mapping under key, replacing a value that is not a mapping (Hermes
// would ignore such a value too) and creating it when absent.
func mappingAt(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			v := m.Content[i+1]
			if v.Kind != yaml.MappingNode {
				v = &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
				m.Content[i+1] = v
			}
			return v
		}
	}
	v := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key}, v)
	return v
}

// setKey replaces the value under key, keeping the comments attached to the old value.
func setKey(m *yaml.Node, key string, v *yaml.Node) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			old := m.Content[i+1]
			v.HeadComment, v.LineComment, v.FootComment = old.HeadComment, old.LineComment, old.FootComment
			m.Content[i+1] = v
			return
		}
	}
	m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key}, v)
}

// encode renders the configuration with two-space indentation, Hermes' own style.
func (c *hermesConfig) encode() ([]byte, error) {
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(c.doc); err != nil {
		return nil, fmt.Errorf("encode Hermes config: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("encode Hermes config: %w", err)
	}
	return b.Bytes(), nil
}
