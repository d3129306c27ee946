package web

import (
	"context"
	"net/http"
	"strconv"
	"strings"

	"hermeshost/handlers"
	"hermeshost/service"
	"hermeshost/templates"
)

// chatTurnEvents is GET <prefix>/chat/turns/{turn}/events: the turn's fragment each time
// the turn changes (its state, and every write its agent makes to state.db), after the
// revision the page showed (?rev=, or Last-Event-ID when the browser reconnects); the last
// event says the turn has ended, and the page's SSE extension closes the stream on it.
// The Runner watches state.db once per running turn, whatever the number of tabs: a
// stream only waits on the Runner and renders what changed.
func chatTurnEvents(h *handlers.Chat) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		t, ok := h.Turn(w, r)
		if !ok {
			return
		}
		var seen uint64
		for _, v := range []string{r.Header.Get("Last-Event-ID"), r.URL.Query().Get("rev")} {
			if n, err := strconv.ParseUint(v, 10, 64); err == nil {
				seen = n
				break
			}
		}
		stream, ok := openSSE(w, liveRetry, liveWriteTimeout)
		if !ok {
			return
		}
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		go func() {
			select {
			case <-service.ShuttingDown(ctx):
				cancel() // the browser reconnects to the next dashboard with its last id
			case <-ctx.Done():
			}
		}()
		var b strings.Builder
		for {
			if t.Rev > seen {
				html, err := h.TurnFragment(r.WithContext(ctx), t)
				if err != nil {
					if ctx.Err() == nil {
						h.Log.Warn("dashboard: render a chat turn", "turn", t.ID, "err", err)
					}
					return
				}
				b.Reset()
				writeMessage(&b, liveMessage{LiveFragment: handlers.LiveFragment{ID: int64(t.Rev), Event: templates.ChatTurnEvent, HTML: html}, final: true})
				if !stream.write(b.String()) {
					return
				}
				seen = t.Rev
			}
			if !t.Active() {
				stream.write("event: " + templates.ChatTurnEndEvent + "\ndata: ended\n\n")
				return
			}
			wait, done := context.WithTimeout(ctx, liveHeartbeat)
			next, ok, err := h.Runner.WaitChange(wait, t.ID, seen)
			done()
			switch {
			case !ok || ctx.Err() != nil:
				return // the turn was forgotten, the client left, or the server is stopping
			case err != nil:
				if !stream.write(": heartbeat\n\n") {
					return
				}
				continue
			}
			t = next
		}
	}
}
