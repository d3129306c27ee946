package sartiqcli

import (
	"context"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"

	"hermeshost/cli"
)

// operation is one operation of the API's OpenAPI document.
type operation struct {
	id, method, path, summary string
	pathParams                []string
	query                     map[string]bool // name -> required
	body                      bodyRule
}

type bodyRule int

const (
	noBody bodyRule = iota
	optionalBody
	requiredBody
)

var templateParam = regexp.MustCompile(`\{([^{}]+)\}`)

// loadOperations reads the document, which must be a valid OpenAPI 3 document, into its
// operations by operationId.
func loadOperations(ctx context.Context, raw []byte) (map[string]operation, error) {
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(raw)
	if err != nil {
		return nil, fmt.Errorf("the API's /openapi.json is not an OpenAPI document: %w", err)
	}
	if err := doc.Validate(ctx); err != nil {
		return nil, fmt.Errorf("the API's /openapi.json is not a valid OpenAPI document: %w", err)
	}
	ops := map[string]operation{}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			if op.OperationID == "" {
				continue
			}
			o := operation{id: op.OperationID, method: method, path: path, summary: op.Summary, query: map[string]bool{}}
			for _, m := range templateParam.FindAllStringSubmatch(path, -1) {
				o.pathParams = append(o.pathParams, m[1])
			}
			for _, p := range append(append(openapi3.Parameters{}, item.Parameters...), op.Parameters...) {
				if p.Value != nil && p.Value.In == openapi3.ParameterInQuery {
					o.query[p.Value.Name] = p.Value.Required
				}
			}
			if rb := op.RequestBody; rb != nil && rb.Value != nil {
				o.body = optionalBody
				if rb.Value.Required {
					o.body = requiredBody
				}
			}
			ops[o.id] = o
		}
	}
	return ops, nil
}

// sortedMatching is the operations whose operationId, path or summary contains sub
// (case-insensitive), by operationId.
func sortedMatching(ops map[string]operation, sub string) []operation {
	sub = strings.ToLower(sub)
	var out []operation
	for _, o := range ops {
		if strings.Contains(strings.ToLower(o.id+" "+o.path+" "+o.summary), sub) {
			out = append(out, o)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

// build turns a call's arguments into the request path (escaped), query and body,
// checking them against the operation: every path parameter given and no other, query
// parameters the operation declares, a body only where it takes one.
func (o operation) build(a *CallArgs) (string, url.Values, []byte, error) {
	path := o.path
	for _, name := range o.pathParams {
		v, ok := a.Path[name]
		if !ok {
			return "", nil, nil, cli.Usagef("%s needs --path %s=VALUE (%s %s)", o.id, name, o.method, o.path)
		}
		if v == "" {
			return "", nil, nil, cli.Usagef("--path %s is empty", name)
		}
		path = strings.Replace(path, "{"+name+"}", url.PathEscape(v), 1)
	}
	for name := range a.Path {
		if !slices.Contains(o.pathParams, name) {
			return "", nil, nil, cli.Usagef("%s has no path parameter %q (%s %s)", o.id, name, o.method, o.path)
		}
	}
	for name := range a.Query {
		if _, ok := o.query[name]; !ok {
			return "", nil, nil, cli.Usagef("%s has no query parameter %q%s", o.id, name, o.knownQuery())
		}
	}
	for name, required := range o.query {
		if required && a.Query.Get(name) == "" {
			return "", nil, nil, cli.Usagef("%s needs --query %s=VALUE", o.id, name)
		}
	}
	switch {
	case a.Body != nil && o.body == noBody:
		return "", nil, nil, cli.Usagef("%s takes no request body; drop --json", o.id)
	case a.Body == nil && o.body == requiredBody:
		return "", nil, nil, cli.Usagef("%s needs a request body: --json '{...}'", o.id)
	}
	return path, a.Query, a.Body, nil
}

func (o operation) knownQuery() string {
	if len(o.query) == 0 {
		return " (it takes none)"
	}
	var names []string
	for n := range o.query {
		names = append(names, n)
	}
	sort.Strings(names)
	return " (known: " + strings.Join(names, ", ") + ")"
}
