package orghome

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

func testSetup() AgentSetup {
	return AgentSetup{
		Provider: "hermes-host", BaseURL: "http://127.0.0.1:8091/v1", Model: "demo-worker",
		KeyEnv: "HERMES_HOST_GATEWAY_KEY", BundledSkills: "/opt/hermes/skills",
		Plugin: Plugin{Name: "hermes_host", Files: map[string][]byte{
			"plugin.yaml": []byte("name: hermes_host\n"), "__init__.py": []byte("def register(ctx):\n    pass\n"),
		}},
	}
}

// settings decodes config.yaml as Hermes would read it.
func settings(t *testing.T, h *Home) map[string]any {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(h.Dir, "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(raw, &m); err != nil {
		t.Fatalf("config.yaml the host wrote is not YAML: %v\n%s", err, raw)
	}
	return m
}

func at(m map[string]any, keys ...string) any {
	var v any = m
	for _, k := range keys {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = mm[k]
	}
	return v
}

func TestAgentSetupNamesTheGatewayAsTheProvider(t *testing.T) {
	_, h := newHome(t, "acme")
	res, err := h.EnsureAgentSetup(testSetup())
	if err != nil {
		t.Fatal(err)
	}
	if !res.ConfigWritten || !res.NoBundledSkills || len(res.PluginFiles) != 2 {
		t.Fatalf("first setup: %+v", res)
	}
	m := settings(t, h)
	for _, c := range []struct {
		keys []string
		want any
	}{
		{[]string{"model", "provider"}, "hermes-host"},
		{[]string{"model", "default"}, "demo-worker"},
		{[]string{"providers", "hermes-host", "base_url"}, "http://127.0.0.1:8091/v1"},
		{[]string{"providers", "hermes-host", "key_env"}, "HERMES_HOST_GATEWAY_KEY"},
		{[]string{"providers", "hermes-host", "default_model"}, "demo-worker"},
		{[]string{"security", "tirith_enabled"}, false},
	} {
		if got := at(m, c.keys...); got != c.want {
			t.Errorf("%s = %#v, want %#v", strings.Join(c.keys, "."), got, c.want)
		}
	}
	if got := at(m, "skills", "external_dirs"); !equalList(got, "/opt/hermes/skills") {
		t.Errorf("skills.external_dirs = %#v", got)
	}
	if got := at(m, "plugins", "enabled"); !equalList(got, "hermes_host") {
		t.Errorf("plugins.enabled = %#v", got)
	}
	if _, err := os.Stat(filepath.Join(h.Dir, NoBundledSkillsFile)); err != nil {
		t.Fatal(err)
	}
	for name, want := range testSetup().Plugin.Files {
		got, err := os.ReadFile(filepath.Join(h.Dir, "plugins", "hermes_host", name))
		if err != nil || string(got) != string(want) {
			t.Fatalf("plugin file %s: %q, %v", name, got, err)
		}
	}

	// The second start finds everything in place and writes nothing.
	before, _ := os.ReadFile(filepath.Join(h.Dir, "config.yaml"))
	res, err = h.EnsureAgentSetup(testSetup())
	if err != nil || res.ConfigWritten || res.NoBundledSkills || len(res.PluginFiles) != 0 {
		t.Fatalf("second setup: %+v, %v", res, err)
	}
	after, _ := os.ReadFile(filepath.Join(h.Dir, "config.yaml"))
	if string(before) != string(after) {
		t.Fatal("an unchanged setup rewrote config.yaml")
	}

	// A plugin file changed in the home (an older version, or tampering) is put back.
	writeFile(t, h.Dir, "plugins/hermes_host/__init__.py", "raise SystemExit\n")
	res, err = h.EnsureAgentSetup(testSetup())
	if err != nil || len(res.PluginFiles) != 1 || res.PluginFiles[0] != "plugins/hermes_host/__init__.py" {
		t.Fatalf("setup over a changed plugin file: %+v, %v", res, err)
	}
}

func equalList(v any, want ...string) bool {
	l, ok := v.([]any)
	if !ok || len(l) != len(want) {
		return false
	}
	for i := range l {
		if l[i] != want[i] {
			return false
		}
	}
	return true
}

func TestAgentSetupKeepsOtherSettingsCommentsAndOrder(t *testing.T) {
	_, h := newHome(t, "acme")
	existing := `# Settings of acme's agent, kept by a person.
display:
  # the person's theme
  skin: mono
model:
  default: some/other-model # replaced by the host's
  base_url: https://elsewhere.example/v1
  api_key: sk-do-not-keep
  context_length: 64000
providers:
  local:
    base_url: http://127.0.0.1:11434/v1
skills:
  external_dirs: /srv/shared-skills
  disabled:
    - old-skill
plugins:
  enabled: [someone_elses]
memory:
  memory_char_limit: 3000
`
	writeFile(t, h.Dir, "config.yaml", existing)
	if _, err := h.EnsureAgentSetup(testSetup()); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(filepath.Join(h.Dir, "config.yaml"))
	text := string(raw)
	for _, kept := range []string{"# Settings of acme's agent, kept by a person.", "# the person's theme", "skin: mono",
		"context_length: 64000", "memory_char_limit: 3000", "old-skill", "http://127.0.0.1:11434/v1"} {
		if !strings.Contains(text, kept) {
			t.Errorf("lost %q:\n%s", kept, text)
		}
	}
	for _, gone := range []string{"sk-do-not-keep", "elsewhere.example"} {
		if strings.Contains(text, gone) {
			t.Errorf("kept %q in the model block, which would send the agent past the gateway:\n%s", gone, text)
		}
	}
	if i, j := strings.Index(text, "display:"), strings.Index(text, "memory:"); i < 0 || j < i {
		t.Errorf("the order of the top-level keys changed:\n%s", text)
	}
	m := settings(t, h)
	if got := at(m, "skills", "external_dirs"); !equalList(got, "/srv/shared-skills", "/opt/hermes/skills") {
		t.Errorf("skills.external_dirs = %#v", got)
	}
	if got := at(m, "plugins", "enabled"); !equalList(got, "someone_elses", "hermes_host") {
		t.Errorf("plugins.enabled = %#v", got)
	}
	if got := at(m, "model", "default"); got != "demo-worker" {
		t.Errorf("model.default = %#v", got)
	}
	rs, err := h.Receipts("config.yaml")
	if err != nil || len(rs) != 1 {
		t.Fatalf("receipts of the replaced config.yaml: %v, %v", rs, err)
	}
	if prev, _ := os.ReadFile(rs[0].Path); string(prev) != existing {
		t.Fatalf("the receipt is not the person's file:\n%s", prev)
	}
}

func TestAgentSetupRefusesAConfigItCannotParseAndLeavesIt(t *testing.T) {
	_, h := newHome(t, "acme")
	bad := "model:\n  provider: x\n  default: [unclosed\nsecurity: {}\n"
	writeFile(t, h.Dir, "config.yaml", bad)
	_, err := h.EnsureAgentSetup(testSetup())
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.File != filepath.Join(h.Dir, "config.yaml") || ce.Line == 0 {
		t.Fatalf("setup over a broken config.yaml: %#v", err)
	}
	if !strings.Contains(err.Error(), filepath.Join(h.Dir, "config.yaml")+" line ") {
		t.Fatalf("the error does not name the file and line: %v", err)
	}
	if raw, _ := os.ReadFile(filepath.Join(h.Dir, "config.yaml")); string(raw) != bad {
		t.Fatal("a broken config.yaml was changed")
	}
	for _, name := range []string{NoBundledSkillsFile, "plugins"} {
		if _, err := os.Stat(filepath.Join(h.Dir, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s was written although the setup failed", name)
		}
	}
}

func TestAgentSetupRefusesBadValues(t *testing.T) {
	_, h := newHome(t, "acme")
	for _, edit := range []func(*AgentSetup){
		func(s *AgentSetup) { s.KeyEnv = "not a name" },
		func(s *AgentSetup) { s.Provider = "" },
		func(s *AgentSetup) { s.Model = "" },
		func(s *AgentSetup) { s.Plugin.Name = "../x" },
		func(s *AgentSetup) { s.Plugin.Files = map[string][]byte{"../../SOUL.md": nil} },
	} {
		s := testSetup()
		edit(&s)
		if _, err := h.EnsureAgentSetup(s); err == nil {
			t.Errorf("setup %+v was accepted", s)
		}
	}
	if _, err := os.Stat(filepath.Join(h.Dir, "config.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("a refused setup wrote config.yaml")
	}
}
