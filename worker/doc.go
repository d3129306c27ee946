// Package worker is what runs inside an organization's worker container for one job:
// `hermes-host worker run-job`. It checks the job is addressed to its own org, takes the
// home's lock, prepares the workspace, runs the agent with the job type's prompt, heartbeats,
// keeps the job token out of the agent's reach behind a local proxy, checkpoints what the
// agent persisted, and reports the outcome.
package worker

import "encoding/json"

func jsonIndent(v any) ([]byte, error) { return json.MarshalIndent(v, "", "  ") }
