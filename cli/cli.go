// Package cli runs hermes-host's subcommands: flag parsing, --help that lists each
// command's flags and environment variables with their defaults, and one-line errors.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"hermeshost/config"
)

// Command is one subcommand, or a group of them (Subcommands set). A group with a Setup
// of its own runs it when no subcommand is named (`gateway` serves, `gateway login` logs in).
type Command struct {
	Name    string
	Summary string
	// Args describes the positional arguments in --help, e.g. "up|down|status".
	Args string
	// Env lists the variables the command reads, for --help.
	Env []config.Var
	// Setup defines the command's flags and returns what runs once they are parsed.
	Setup       func(fs *flag.FlagSet) func(ctx context.Context, args []string) error
	Subcommands []*Command
}

// UsageError is a mistake in how a command was called; it exits 2, not 1.
type UsageError struct{ Msg string }

func (e *UsageError) Error() string { return e.Msg }

// Usagef makes a UsageError.
func Usagef(format string, a ...any) error { return &UsageError{Msg: fmt.Sprintf(format, a...)} }

// Run finds the command named by args and runs it; it returns the process exit code.
func Run(ctx context.Context, root *Command, args []string, stdout, stderr io.Writer) int {
	cmd, path, rest := root, []string{root.Name}, args
	for len(cmd.Subcommands) > 0 {
		if cmd.Setup != nil && (len(rest) == 0 || find(cmd, rest[0]) == nil && rest[0] != "help") {
			break
		}
		if len(rest) == 0 || rest[0] == "-h" || rest[0] == "--help" || rest[0] == "help" {
			printGroup(stdout, cmd, path)
			if len(rest) == 0 {
				return 2
			}
			return 0
		}
		next := find(cmd, rest[0])
		if next == nil {
			fmt.Fprintf(stderr, "%s: unknown command %q (see %s --help)\n", strings.Join(path, " "), rest[0], strings.Join(path, " "))
			return 2
		}
		cmd, path, rest = next, append(path, next.Name), rest[1:]
	}
	name := strings.Join(path, " ")
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	run := cmd.Setup(fs)
	fs.Usage = func() { printCommand(stdout, cmd, name, fs) }
	if err := fs.Parse(rest); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if err := run(ctx, fs.Args()); err != nil {
		fmt.Fprintf(stderr, "%s: %s\n", name, oneLine(err.Error()))
		var ue *UsageError
		if errors.As(err, &ue) {
			return 2
		}
		return 1
	}
	return 0
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func find(group *Command, name string) *Command {
	for _, c := range group.Subcommands {
		if c.Name == name {
			return c
		}
	}
	return nil
}

func printGroup(w io.Writer, group *Command, path []string) {
	name := strings.Join(path, " ")
	fmt.Fprintf(w, "%s: %s\n\nUsage: %s <command> [flags]\n\nCommands:\n", name, group.Summary, name)
	for _, c := range group.Subcommands {
		fmt.Fprintf(w, "  %-12s %s\n", c.Name, c.Summary)
	}
	fmt.Fprintf(w, "\nRun '%s <command> --help' for a command's flags and environment.\n", name)
}

func printCommand(w io.Writer, cmd *Command, name string, fs *flag.FlagSet) {
	fmt.Fprintf(w, "%s: %s\n\nUsage: %s [flags] %s\n", name, cmd.Summary, name, cmd.Args)
	var flags []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) { flags = append(flags, f) })
	if len(flags) > 0 {
		fmt.Fprintf(w, "\nFlags:\n")
		for _, f := range flags {
			def := ""
			if f.DefValue != "" {
				def = fmt.Sprintf(" (default %s)", f.DefValue)
			}
			fmt.Fprintf(w, "  --%-18s %s%s\n", f.Name, f.Usage, def)
		}
	}
	if len(cmd.Subcommands) > 0 {
		fmt.Fprintf(w, "\nCommands:\n")
		for _, c := range cmd.Subcommands {
			fmt.Fprintf(w, "  %-12s %s\n", c.Name, c.Summary)
		}
	}
	if len(cmd.Env) > 0 {
		env := append([]config.Var(nil), cmd.Env...)
		sort.Slice(env, func(i, j int) bool { return env[i].Name < env[j].Name })
		fmt.Fprintf(w, "\nEnvironment:\n")
		example := "" // a secret's file form, when the command reads a secret
		for _, v := range env {
			fmt.Fprintf(w, "  %-20s %s%s\n", v.Name, v.Usage, describeDefault(v))
			if v.Secret && example == "" {
				example = v.FileVar()
			}
		}
		if example != "" {
			fmt.Fprintf(w, "\nA secret NAME may instead be read from the file NAME_FILE names (%s=/run/secrets/...,\n"+
				"as Docker secrets mount it), with one trailing newline trimmed; setting both is an error.\n", example)
		}
	}
}

func describeDefault(v config.Var) string {
	var parts []string
	if v.Default != "" {
		parts = append(parts, "default "+v.Default)
	}
	if v.Secret {
		// As config reads them: blank is unset.
		state := "not set"
		if strings.TrimSpace(os.Getenv(v.Name)) != "" {
			state = "set"
		} else if strings.TrimSpace(os.Getenv(v.FileVar())) != "" {
			state = "set from " + v.FileVar()
		}
		parts = append(parts, "secret, "+state)
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, "; ") + ")"
}
