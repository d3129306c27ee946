package handlers

import (
	"errors"
	"net/http"

	"hermeshost/orghome"
	"hermeshost/templates"
)

// Skills is GET <prefix>/skills: the home's skills and the image's bundled ones, at any
// depth, each enabled or disabled (config.yaml's skills.disabled, where the cap puts
// them), with its last use as the cap reads it; broken ones with the reason, and names
// claimed twice.
func (h *Dashboard) Skills(w http.ResponseWriter, r *http.Request) {
	v := templates.SkillsView{Frame: h.frame(r.Context(), templates.NavSkills), Max: h.SkillsMax}
	if h.Bundled != nil {
		v.BundledDir = h.Bundled.Dir
	}
	set, err := h.Home.Skills(h.Bundled)
	if err != nil {
		h.Log.Warn("dashboard: read skills", "org", h.Org, "err", err)
		v.Error = err.Error()
		h.Render(w, r, http.StatusOK, templates.DashboardSkills(v))
		return
	}
	used := map[string]orghome.SkillUse{}
	uses, err := h.Home.SkillUsage(r.Context(), h.Bundled)
	switch {
	case errors.Is(err, orghome.ErrStateInterrupted):
		v.UsageNote = "Last use is not shown: state.db holds a write Hermes did not finish, which it rolls back when it next starts in this home (the organization's next job or chat)."
	case errors.Is(err, orghome.ErrStateBusy):
		v.UsageNote = "Last use is not shown: state.db is busy (Hermes is checkpointing it); reload the page in a moment."
	case err != nil:
		h.Log.Warn("dashboard: read skill usage", "org", h.Org, "err", err)
		v.UsageNote = "Last use is not shown: " + err.Error()
	default:
		for _, u := range uses {
			used[u.Dir] = u
		}
	}
	for _, s := range set.Skills {
		row := templates.SkillRow{
			Name: s.Name, Description: s.Description, Category: s.Category, Dir: s.Dir,
			Source: s.Source, Disabled: s.Disabled, LastUsed: "—",
		}
		if s.Source == orghome.SkillBundled {
			row.Dir = "bundled: " + s.Dir
		}
		if s.Source == orghome.SkillAuthored {
			v.Authored++
			if !s.Disabled {
				v.AuthoredEnabled++
			}
			if u, ok := used[s.Dir]; ok {
				row.LastUsed, row.LastUsedBy = shownTime(u.LastUsed), u.Source
			}
		}
		v.Skills = append(v.Skills, row)
	}
	for _, b := range set.Broken {
		v.Broken = append(v.Broken, templates.BrokenSkillRow{Dir: b.Dir, Bundled: b.Bundled, Reason: b.Reason})
	}
	for _, d := range set.Duplicates {
		v.Duplicates = append(v.Duplicates, templates.DuplicateSkillRow{Name: d.Name, Dirs: d.Dirs})
	}
	h.Render(w, r, http.StatusOK, templates.DashboardSkills(v))
}
