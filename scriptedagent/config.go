package scriptedagent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// PluginName is the host's plugin as Hermes loads it: plugins/<PluginName>/, enabled by name.
const PluginName = "hermes_host"

// endpoint is where the real CLI sends its model calls: config.yaml's model block names a
// provider, and the providers block gives its base URL and the variable holding its key.
// Nothing comes from OPENAI_BASE_URL or HERMES_MODEL, which the real CLI ignores.
type endpoint struct {
	provider string
	baseURL  string
	key      string
	model    string
}

// settings is the part of config.yaml the stand-in reads, as the real CLI reads it.
type settings struct {
	Model     yaml.Node `yaml:"model"`
	Providers map[string]struct {
		BaseURL      string `yaml:"base_url"`
		KeyEnv       string `yaml:"key_env"`
		DefaultModel string `yaml:"default_model"`
	} `yaml:"providers"`
	Plugins struct {
		Enabled []string `yaml:"enabled"`
	} `yaml:"plugins"`
}

// errNoProvider is the real CLI's situation without a configured provider: it goes to its
// built-in default (OpenRouter) and, offline, exits 1 after three retries.
var errNoProvider = errors.New("no model provider configured in config.yaml: the real CLI would fall back to OpenRouter and fail offline")

func readSettings(home string) (settings, error) {
	var s settings
	raw, err := os.ReadFile(filepath.Join(home, "config.yaml"))
	if errors.Is(err, fs.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return s, err
	}
	if err := yaml.Unmarshal(raw, &s); err != nil {
		return s, fmt.Errorf("config.yaml: %w", err)
	}
	return s, nil
}

// endpoint resolves the model endpoint: -m and --provider flags override the model block.
func (s settings) endpoint(flagModel, flagProvider string) (endpoint, error) {
	var block struct {
		Provider string `yaml:"provider"`
		Default  string `yaml:"default"`
	}
	if s.Model.Kind == yaml.MappingNode {
		_ = s.Model.Decode(&block)
	}
	e := endpoint{provider: block.Provider, model: block.Default}
	if flagProvider != "" {
		e.provider = flagProvider
	}
	if flagModel != "" {
		e.model = flagModel
	}
	p, ok := s.Providers[e.provider]
	if e.provider == "" || !ok || p.BaseURL == "" {
		return endpoint{}, errNoProvider
	}
	e.baseURL = strings.TrimRight(p.BaseURL, "/")
	if e.model == "" {
		e.model = p.DefaultModel
	}
	if e.model == "" {
		return endpoint{}, fmt.Errorf("config.yaml names provider %q but no model", e.provider)
	}
	if p.KeyEnv != "" {
		e.key = os.Getenv(p.KeyEnv)
	}
	return e, nil
}

// pluginLoaded says whether Hermes would load the host's plugin: listed in plugins.enabled
// and present under plugins/.
func (s settings) pluginLoaded(home string) bool {
	if !slices.Contains(s.Plugins.Enabled, PluginName) {
		return false
	}
	for _, f := range []string{"plugin.yaml", "__init__.py"} {
		if fi, err := os.Stat(filepath.Join(home, "plugins", PluginName, f)); err != nil || !fi.Mode().IsRegular() {
			return false
		}
	}
	return true
}
