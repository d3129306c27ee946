package handlers

import (
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/a-h/templ"

	"hermeshost/orghome"
	"hermeshost/templates"
)

// hermesSessionsPage is how many Hermes sessions one page lists.
const hermesSessionsPage = 50

// HermesSessions is GET <prefix>/sessions?q=&after=: the org's Hermes sessions, newest
// first, a page at a time by keyset (after is the previous page's cursor), searched
// through state.db's own full-text index when q is given. An htmx request (the search
// form) gets the list alone.
func (h *Dashboard) HermesSessions(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	query := orghome.SessionQuery{Search: strings.TrimSpace(q.Get("q")), After: q.Get("after"), Limit: hermesSessionsPage}
	v := templates.HermesSessionsView{Frame: h.frame(r.Context(), templates.NavSessions), Query: query.Search, Newer: query.After != ""}
	if v.Newer {
		v.First = h.Paths().PageWith("/sessions", searchValues(query.Search, ""))
	}
	st, err := h.Home.State()
	switch {
	case errors.Is(err, orghome.ErrNoSessions):
		v.NoState = true
		h.renderHermesSessions(w, r, v)
		return
	case err != nil:
		h.Failed(w, r, err)
		return
	}
	page, err := st.Sessions(r.Context(), query)
	switch {
	case errors.Is(err, orghome.ErrNoSessions):
		v.NoState = true
	case err != nil && query.After != "" && strings.HasPrefix(err.Error(), "bad sessions cursor"):
		h.Error(w, r, http.StatusBadRequest, "This page of sessions is not one the dashboard made. Start again from the newest sessions.")
		return
	case err != nil:
		h.Failed(w, r, err)
		return
	}
	v.Busy = page.Status == orghome.StatusBusy
	v.Interrupted = page.Status == orghome.StatusInterrupted
	v.Groups = h.groupHermesSessions(page.Sessions)
	if page.NextCursor != "" {
		v.Next = h.Paths().PageWith("/sessions", searchValues(query.Search, page.NextCursor))
	}
	h.renderHermesSessions(w, r, v)
}

func (h *Dashboard) renderHermesSessions(w http.ResponseWriter, r *http.Request, v templates.HermesSessionsView) {
	if IsHTMX(r) {
		h.Render(w, r, http.StatusOK, templates.HermesSessionList(v))
		return
	}
	h.Render(w, r, http.StatusOK, templates.DashboardHermesSessions(v))
}

func searchValues(search, after string) url.Values {
	v := url.Values{}
	if search != "" {
		v.Set("q", search)
	}
	if after != "" {
		v.Set("after", after)
	}
	return v
}

// groupHermesSessions puts each session whose parent is on the page under the parent's
// group (a subagent run, or a compression continuation when the parent ended for
// compression; a chain of them goes under its first), oldest first. A child whose
// parent is on another page stands alone, linking to it.
func (h *Dashboard) groupHermesSessions(sessions []orghome.Session) []templates.HermesSessionGroup {
	byID := make(map[string]orghome.Session, len(sessions))
	for _, s := range sessions {
		if s.ID != "" { // no parent_session_id of "" names it
			byID[s.ID] = s
		}
	}
	// root is the group a session goes in: its furthest ancestor on the page, and how far
	// below it the session is. Parents that loop (no real state.db has them) leave a
	// session at the top.
	root := func(s orghome.Session) (string, int) {
		id, depth, seen := s.ID, 0, map[string]bool{s.ID: true}
		for p, ok := byID[s.ParentID]; ok; p, ok = byID[p.ParentID] {
			if seen[p.ID] {
				return s.ID, 0
			}
			seen[p.ID] = true
			id, depth = p.ID, depth+1
		}
		return id, depth
	}
	var groups []templates.HermesSessionGroup
	index := map[string]int{}
	type child struct {
		root string
		row  templates.HermesSessionRow
	}
	var children []child
	for _, s := range sessions {
		row := h.hermesSessionRow(s, byID)
		if id, depth := root(s); depth > 0 {
			row.Depth = depth
			children = append(children, child{id, row})
			continue
		}
		index[s.ID] = len(groups)
		groups = append(groups, templates.HermesSessionGroup{Session: row})
	}
	// The page is newest first; under its parent a chain reads in the order it ran.
	for _, c := range slices.Backward(children) {
		g := &groups[index[c.root]]
		g.Children = append(g.Children, c.row)
	}
	return groups
}

// hermesSessionRow is one session as the pages show it; byID holds the sessions of the
// page, which say what kind of child it is.
func (h *Dashboard) hermesSessionRow(s orghome.Session, byID map[string]orghome.Session) templates.HermesSessionRow {
	row := templates.HermesSessionRow{
		ID: s.ID, Link: h.hermesSessionLink(s.ID), Title: s.Title, Source: s.Source, Model: s.Model,
		Started: shownTime(s.StartedAt), Ended: "open", EndReason: s.EndReason, Messages: s.MessageCount,
		Tokens: "—", TokensIn: "—", TokensOut: "—", Cost: shownCost(s.CostUSD),
	}
	if !s.EndedAt.IsZero() {
		row.Ended = shownTime(s.EndedAt)
	}
	if s.Tokens != nil {
		row.Tokens, row.TokensIn, row.TokensOut = shownCount(s.Tokens.Total()), shownCount(s.Tokens.Input), shownCount(s.Tokens.Output)
	}
	if s.ParentID != "" {
		row.ParentID, row.ParentLink = s.ParentID, h.hermesSessionLink(s.ParentID)
		switch p, ok := byID[s.ParentID]; {
		case !ok:
			row.Kind = "child"
		case p.EndReason == "compression":
			row.Kind = "compression continuation"
		default:
			row.Kind = "subagent"
		}
	}
	return row
}

func (h *Dashboard) hermesSessionLink(id string) templ.SafeURL {
	return h.Paths().Page("/sessions/" + url.PathEscape(id))
}
