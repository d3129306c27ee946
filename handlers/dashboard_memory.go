package handlers

import (
	"net/http"

	"hermeshost/orghome"
	"hermeshost/templates"
)

// Memory is GET <prefix>/memory: MEMORY.md and USER.md, their entries and their fill
// against Hermes' limits. Read-only: Hermes owns the files.
func (h *Dashboard) Memory(w http.ResponseWriter, r *http.Request) {
	v := templates.MemoryView{Frame: h.frame(r.Context(), templates.NavMemory)}
	m, err := h.Home.Memory()
	if err != nil {
		h.Log.Error("dashboard: read memory", "org", h.Org, "err", err)
		v.Error = err.Error()
		h.Render(w, r, http.StatusOK, templates.DashboardMemory(v))
		return
	}
	v.Files = []templates.MemoryFileView{
		memoryFile(m.Memory, "The agent's own notes: what it learned about the work, kept across sessions."),
		memoryFile(m.User, "What the agent knows about the people it works with."),
	}
	h.Render(w, r, http.StatusOK, templates.DashboardMemory(v))
}

func memoryFile(f orghome.MemoryFile, purpose string) templates.MemoryFileView {
	return templates.MemoryFileView{
		Name: f.Name, Purpose: purpose, Exists: f.Exists, Entries: f.Entries,
		Chars: f.Chars, Limit: f.Limit, Percent: f.Percent(), Over: f.Over,
	}
}
