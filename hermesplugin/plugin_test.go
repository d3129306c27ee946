package hermesplugin

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"hermeshost/hermescli"
	"hermeshost/subagent"
)

func TestFilesAreThePluginHermesLoads(t *testing.T) {
	files := Files()
	if len(files) != 2 || files["plugin.yaml"] == nil || files["__init__.py"] == nil {
		names := make([]string, 0, len(files))
		for n := range files {
			names = append(names, n)
		}
		t.Fatalf("files %v, want plugin.yaml and __init__.py", names)
	}
	// Hermes matches plugins.enabled on the manifest's name for a flat user plugin, and
	// imports the folder as a Python package.
	if !regexp.MustCompile(`(?m)^name: ` + Name + `$`).Match(files["plugin.yaml"]) {
		t.Fatalf("plugin.yaml does not name the plugin %s:\n%s", Name, files["plugin.yaml"])
	}
	if !regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`).MatchString(Name) {
		t.Fatalf("%q is not a Python package name", Name)
	}
	src := files["__init__.py"]
	if !bytes.Contains(src, []byte("\ndef register(ctx):")) {
		t.Fatal("__init__.py defines no register(ctx)")
	}
	// Hermes' loader takes a plugin whose source says these for a memory or model provider
	// and never loads it as a plugin of hooks.
	for _, marker := range []string{"MemoryProvider", "register_memory_provider", "ProviderProfile"} {
		if bytes.Contains(src, []byte(marker)) {
			t.Errorf("__init__.py says %q, which makes Hermes load it as something else", marker)
		}
	}
	files["plugin.yaml"][0] = 'X'
	delete(files, "__init__.py")
	if again := Files(); again["plugin.yaml"][0] != 'n' || again["__init__.py"] == nil {
		t.Fatal("Files handed out the embedded content itself")
	}
}

// The plugin clips text to the host's limits and names the worker's socket variable: the
// numbers are the Go side's, checked here so that a change there shows up.
func TestThePluginKeepsToTheHostsLimits(t *testing.T) {
	src := string(Files()["__init__.py"])
	for name, want := range map[string]int{
		"MAX_GOAL": subagent.MaxGoalLen, "MAX_ROLE": subagent.MaxRoleLen,
		"MAX_SUMMARY": subagent.MaxSummaryLen, "MAX_ACK": subagent.MaxPending,
	} {
		m := regexp.MustCompile(`(?m)^` + name + ` = (\d+)$`).FindStringSubmatch(src)
		if m == nil {
			t.Errorf("__init__.py sets no %s", name)
			continue
		}
		if got, _ := strconv.Atoi(m[1]); got != want {
			t.Errorf("%s = %d in the plugin, the host's limit is %d", name, got, want)
		}
	}
	if !strings.Contains(src, `SOCKET_ENV = "`+hermescli.HooksSocketEnv+`"`) {
		t.Errorf("the plugin does not read the worker's %s", hermescli.HooksSocketEnv)
	}
}

func TestVersionIsAShortDigestOfEveryFile(t *testing.T) {
	v := Version()
	if !regexp.MustCompile(`^[0-9a-f]{12}$`).MatchString(v) || Version() != v {
		t.Fatalf("version %q, or not stable", v)
	}
	if digest(Files()) != v {
		t.Fatal("the version is not the digest of the files")
	}
	base := map[string][]byte{"a": []byte("xy"), "b": []byte("z")}
	for name, other := range map[string]map[string][]byte{
		"a byte changed":            {"a": []byte("xY"), "b": []byte("z")},
		"a file renamed":            {"a": []byte("xy"), "c": []byte("z")},
		"a file added":              {"a": []byte("xy"), "b": []byte("z"), "c": nil},
		"bytes moved across files":  {"a": []byte("x"), "b": []byte("yz")},
		"a name's bytes in content": {"a": []byte("xyb"), "": []byte("z")},
	} {
		if digest(other) == digest(base) {
			t.Errorf("%s: same version", name)
		}
	}
	if digest(map[string][]byte{"b": []byte("z"), "a": []byte("xy")}) != digest(base) {
		t.Error("the version depends on the map's order")
	}
}
