package scriptedagent

import (
	"encoding/json"
	"fmt"
	"time"

	"hermeshost/orghome/hermesstate"
)

// chat plays a dashboard's chat turn: a run whose working directory holds no job manifest.
// It answers the message through the gateway's model step by step, storing each row as it
// goes (a tool call, its result, the assistant's answer) so that a page watching state.db
// sees the reply form, and prints the answer as the real CLI's quiet mode does.
// ChatStepMS (scripted-agent.json chat_step_ms) waits before each step, for tests that
// need a turn still running.
func (r *run) chat() (int, error) {
	callID := "call_" + newID()
	args, _ := json.Marshal(map[string]string{"query": r.prompt})
	if err := r.chatStep(); err != nil {
		return ExitFailed, err
	}
	if err := r.message("assistant", "", []hermesstate.ToolCall{{ID: callID, Name: "session_search", Arguments: string(args)}}, "", ""); err != nil {
		return ExitFailed, err
	}
	if err := r.chatStep(); err != nil {
		return ExitFailed, err
	}
	if err := r.message("tool", `{"results": []}`, nil, "session_search", callID); err != nil {
		return ExitFailed, err
	}
	if err := r.chatStep(); err != nil {
		return ExitFailed, err
	}
	answer, err := r.ask(r.prompt)
	if err != nil {
		return ExitFailed, err
	}
	fmt.Fprintln(r.stdout, answer)
	return ExitOK, nil
}

// chatStep waits the knob's step time, or until the agent is stopped.
func (r *run) chatStep() error {
	if r.knobs.ChatStepMS <= 0 {
		return nil
	}
	t := time.NewTimer(time.Duration(r.knobs.ChatStepMS) * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-r.ctx.Done():
		return r.ctx.Err()
	}
}
