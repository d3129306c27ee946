package config

// The process runtime's sandbox (DESIGN section 9), declared like every other variable.
var (
	Sandbox = define(Var{Name: "HERMES_SANDBOX", Default: "auto",
		Usage: "how the process runtime confines each org's units: auto (bubblewrap when it works here), bwrap (required), or none (orgs are then NOT isolated from each other)"})
	AllowUnisolated = define(Var{Name: "HERMES_ALLOW_UNISOLATED", Default: "false",
		Usage: "let a dispatcher run on a process runtime without a sandbox, where orgs are NOT isolated from each other (dev always does, and says so)"})
)
