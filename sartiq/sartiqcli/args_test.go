package sartiqcli

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"hermeshost/cli"
)

func TestParseCallArgs(t *testing.T) {
	a, err := ParseCallArgs([]string{"--path", "org=acme", "proposeGuidelines", "--path=category=tone", "--query", "a=1", "--query", "a=2", "--json", `{"x": 1}`})
	if err != nil {
		t.Fatal(err)
	}
	if a.Op != "proposeGuidelines" || a.Path["org"] != "acme" || a.Path["category"] != "tone" ||
		!slices.Equal(a.Query["a"], []string{"1", "2"}) || string(a.Body) != `{"x": 1}` {
		t.Fatalf("%+v", a)
	}
	for _, bad := range [][]string{{}, {"a", "b"}, {"op", "--path", "x"}, {"op", "--path", "=v"}, {"op", "--path", "k=1", "--path", "k=2"},
		{"op", "--json", "{"}, {"op", "--json", "1", "--json", "2"}, {"op", "--token", "t"}} {
		_, err := ParseCallArgs(bad)
		var ue *cli.UsageError
		if !errors.As(err, &ue) {
			t.Errorf("%q: want a usage error, got %v", bad, err)
		}
	}
}

func TestBuildChecksArgumentsAgainstTheOperation(t *testing.T) {
	op := operation{id: "proposeGuidelines", method: "PUT", path: "/organizations/{org}/guidelines/{category}/proposal",
		pathParams: []string{"org", "category"}, query: map[string]bool{}, body: requiredBody}
	a, _ := ParseCallArgs([]string{"proposeGuidelines", "--path", "org=a/../b", "--path", "category=x y", "--json", "{}"})
	path, _, _, err := op.build(a)
	if err != nil || path != "/organizations/a%2F..%2Fb/guidelines/x%20y/proposal" {
		t.Fatalf("%q %v", path, err)
	}
}

// FuzzParseCallArgs: any command line parses into one operation or fails as a usage
// error; a parsed call always names an operation and its path parameters are well formed.
func FuzzParseCallArgs(f *testing.F) {
	f.Add("startAgentJob --path id=1")
	f.Add("--path org=acme proposeGuidelines --path=category=x --json {}")
	f.Add("listAgentJobs --query status=QUEUED --query limit=2")
	f.Add("op --json [1,2] -- extra")
	f.Add("op --path =x")
	f.Fuzz(func(t *testing.T, line string) {
		args := strings.Split(line, " ")
		a, err := ParseCallArgs(args)
		if err != nil {
			var ue *cli.UsageError
			if !errors.As(err, &ue) {
				t.Fatalf("%q: not a usage error: %v", line, err)
			}
			return
		}
		if a.Op == "" {
			t.Fatalf("%q parsed without an operation", line)
		}
		for k := range a.Path {
			if k == "" || strings.TrimSpace(k) != k {
				t.Fatalf("%q: path key %q", line, k)
			}
		}
		op := operation{id: a.Op, path: "/x/{id}", pathParams: []string{"id"}, query: map[string]bool{}, body: optionalBody}
		if path, _, _, err := op.build(a); err == nil && strings.Count(path, "/") != 2 {
			t.Fatalf("%q: path parameter escaped its segment: %q", line, path)
		}
	})
}
