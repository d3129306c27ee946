package main

import (
	"fmt"
	"log/slog"

	"hermeshost/config"
	"hermeshost/dispatch/runtime"
)

// checkIsolation refuses a runtime that does not isolate orgs from each other (a process
// runtime without a sandbox, which HERMES_RUNTIME=auto may have picked because no engine
// answered) unless HERMES_ALLOW_UNISOLATED allows it; allowed, it is announced, to stdout
// too where the settings ask (dev).
func checkIsolation(rt runtime.Runtime, log *slog.Logger, s dispatcherSettings) error {
	err := runtime.Unisolated(rt)
	if err == nil {
		return nil
	}
	if !s.allowUnisolated {
		return &config.Error{Var: config.AllowUnisolated.Name, Msg: fmt.Sprintf(
			"refusing to start: %v; install bubblewrap (Debian's bubblewrap), or set %s=true to run so",
			err, config.AllowUnisolated.Name)}
	}
	log.Warn("running with orgs NOT isolated from each other", "runtime", rt.Kind(), "reason", err.Error())
	if s.announceUnisolated != nil {
		s.announceUnisolated(err)
	}
	return nil
}
