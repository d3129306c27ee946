package sartiqcli

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strings"

	"hermeshost/cli"
)

// CallArgs is `sartiq call`'s command line: the operation and what fills its request.
type CallArgs struct {
	Op    string
	Path  map[string]string
	Query url.Values
	// Body is the --json value, nil when not given.
	Body []byte
}

// defineCallFlags declares call's flags on fs, filling c. `--help` shows them, and
// ParseCallArgs reads them wherever they stand around the operationId.
func defineCallFlags(fs *flag.FlagSet, c *CallArgs) {
	if c.Path == nil {
		c.Path = map[string]string{}
	}
	if c.Query == nil {
		c.Query = url.Values{}
	}
	fs.Func("path", "a path parameter, name=value (repeatable)", func(s string) error {
		k, v, err := pair(s)
		if err != nil {
			return err
		}
		if _, dup := c.Path[k]; dup {
			return fmt.Errorf("path parameter %q given twice", k)
		}
		c.Path[k] = v
		return nil
	})
	fs.Func("query", "a query parameter, name=value (repeatable)", func(s string) error {
		k, v, err := pair(s)
		if err != nil {
			return err
		}
		c.Query.Add(k, v)
		return nil
	})
	fs.Func("json", "the request body, a JSON document", func(s string) error {
		if c.Body != nil {
			return fmt.Errorf("--json given twice")
		}
		if !json.Valid([]byte(s)) {
			return fmt.Errorf("--json is not valid JSON")
		}
		c.Body = []byte(s)
		return nil
	})
}

func pair(s string) (string, string, error) {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" || strings.TrimSpace(k) != k {
		return "", "", fmt.Errorf("%q is not name=value", s)
	}
	return k, v, nil
}

// ParseCallArgs reads `sartiq call`'s arguments: exactly one operationId, and flags before
// or after it. Mistakes are usage errors (exit 2).
func ParseCallArgs(args []string) (*CallArgs, error) {
	c := &CallArgs{}
	fs := flag.NewFlagSet("call", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	defineCallFlags(fs, c)
	return c, c.parse(fs, args)
}

// parse reads args into c with fs (whose flags fill c), taking the positional argument.
func (c *CallArgs) parse(fs *flag.FlagSet, args []string) error {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return cli.Usagef("%s", err)
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		if args[0] == "--" {
			positional = append(positional, args[1:]...)
			break
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
	switch {
	case len(positional) == 0:
		return cli.Usagef("name the operation: sartiq call <operationId> (list them with sartiq ops)")
	case positional[0] == "":
		return cli.Usagef("the operationId is empty")
	case len(positional) > 1:
		return cli.Usagef("one operation at a time; unexpected %q", strings.Join(positional[1:], " "))
	}
	c.Op = positional[0]
	return nil
}
