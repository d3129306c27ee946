package handlers

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"

	"hermeshost/control"
	"hermeshost/lease"
	"hermeshost/templates"
)

// Bounds of the leases page: how many leases, and how many of each one's newest events.
const (
	leasesShown      = 50
	leaseEventsShown = 5
)

// Leases is GET <prefix>/leases: the org's home: and session: leases (held first) with
// their newest events and, for a held one, a Force release link to the confirmation
// (?confirm=<key>: a form asking for the reason). ?released=<key> after a force release
// says what was done, when the key's newest event is that force release.
func (h *Dashboard) Leases(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	// Read before the leases, so the stream replays whatever changed while they were read.
	live := ""
	if after, ok := liveAfter(r.Context()); ok {
		live = h.Paths().LeaseEvents(after)
	}
	v := h.leasesView(r.Context(), q.Get("released"))
	v.Frame, v.Live = h.frame(r.Context(), templates.NavLeases), live
	if key := q.Get("confirm"); key != "" {
		v.Confirm = key
	}
	h.Render(w, r, http.StatusOK, templates.DashboardLeases(v))
}

// LiveLeases renders the leases table afresh for a page of the org's lease changes: once
// for the page, whatever the number of tabs.
func (h *Dashboard) LiveLeases(ctx context.Context, events []control.FeedEvent) []LiveFragment {
	if len(events) == 0 {
		return nil
	}
	return []LiveFragment{{ID: events[len(events)-1].ID, Event: templates.LiveLeases,
		HTML: renderString(ctx, templates.LeasesTable(h.leasesView(ctx, "")))}}
}

func (h *Dashboard) leasesView(ctx context.Context, released string) templates.LeasesPageView {
	var v templates.LeasesPageView
	ctx, cancel := h.source(ctx)
	defer cancel()
	list, err := h.Control.Leases(ctx, control.LeaseQuery{Limit: leasesShown})
	if err != nil {
		h.Log.Warn("dashboard: leases from the control API", "org", h.Org, "err", err)
		v.Error = err.Error()
		return v
	}
	v.Truncated = list.Truncated
	for _, l := range list.Leases {
		row := templates.LeaseDetailRow{
			Key: l.Key, Holder: l.Holder, Held: l.Held, Epoch: l.Epoch,
			Acquired: shownTime(l.AcquiredAt), Expires: shownTime(l.ExpiresAt),
			Confirm: h.Paths().PageWith("/leases", url.Values{"confirm": {l.Key}}),
		}
		evs, err := h.Control.LeaseEvents(ctx, l.Key, leaseEventsShown)
		if err != nil {
			h.Log.Warn("dashboard: lease events from the control API", "org", h.Org, "key", l.Key, "err", err)
			row.Error = "The events could not be read: " + err.Error()
		}
		for _, e := range evs {
			row.Events = append(row.Events, templates.LeaseEventRow{
				Kind: e.Kind, Holder: e.Holder, Epoch: e.Epoch, Actor: e.Actor, Reason: e.Reason, At: shownTime(e.At),
			})
		}
		if released != "" && l.Key == released && len(evs) > 0 && evs[0].Kind == lease.KindForceRelease {
			v.Notice = "Released " + l.Key + " by force (" + evs[0].Holder + " lost it); the next holding has a new epoch."
		}
		v.Leases = append(v.Leases, row)
	}
	return v
}

// LeaseForceRelease is POST <prefix>/leases/force-release (form: key, reason): frees one of
// the org's own home: or session: leases whoever holds it, through the control API, the
// operator recorded as the actor. Done, it goes back to the page, which says so; refused
// (no reason, not held, another org's or an org: key) the confirmation comes back with why,
// under the refusal's status.
func (h *Dashboard) LeaseForceRelease(w http.ResponseWriter, r *http.Request) {
	key := strings.TrimSpace(r.PostFormValue("key"))
	reason := strings.TrimSpace(r.PostFormValue("reason"))
	var status int
	var refusal string
	switch {
	case key == "":
		status, refusal = http.StatusBadRequest, "Choose a lease to release: its Force release link."
	case reason == "":
		status, refusal = http.StatusBadRequest, "Give a reason; it is recorded with the release. Nothing was released."
	default:
		ctx, cancel := h.source(r.Context())
		defer cancel()
		_, err := h.Control.ForceRelease(ctx, key, actor(r.Context()), reason)
		if err == nil {
			Redirect(w, r, string(h.Paths().PageWith("/leases", url.Values{"released": {key}})))
			return
		}
		status, refusal = forceReleaseRefusal(err)
		if status == http.StatusBadGateway {
			h.Log.Warn("dashboard: force release through the control API", "org", h.Org, "key", key, "err", err)
		}
	}
	v := h.leasesView(r.Context(), "")
	v.Frame, v.Notice, v.Refused = h.frame(r.Context(), templates.NavLeases), refusal, true
	if status == http.StatusBadRequest || status == http.StatusConflict {
		v.Confirm = key // ask again
	}
	h.Render(w, r, status, templates.DashboardLeases(v))
}

func forceReleaseRefusal(err error) (int, string) {
	var e *control.APIError
	switch {
	case control.IsForbidden(err):
		return http.StatusForbidden, "Refused: only this organization's own home: and session: leases can be released here. Nothing was released."
	case control.IsNotFound(err):
		return http.StatusNotFound, "Refused: this organization has no such lease. Nothing was released."
	case control.IsNotHeld(err):
		return http.StatusConflict, "Nobody holds this lease now; there is nothing to release."
	case errors.As(err, &e) && e.Code == control.CodeInvalid:
		return http.StatusBadRequest, "Refused: " + e.Message
	}
	return http.StatusBadGateway, "The dispatcher's control API did not answer; nothing was released. Try again in a moment."
}
