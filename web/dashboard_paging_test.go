package web_test

import (
	"testing"

	"hermeshost/orghome/hermesstate"
)

// A long session is read a page at a time: 200 messages, then the later ones, and back.
func TestALongTranscriptIsPaged(t *testing.T) {
	home := newOrgHome(t, t.TempDir(), "acme", 22)
	home.session(hermesstate.Session{ID: "20261201_100000_abcdef", StartedAt: 1_790_000_000})
	for i := range 450 {
		home.message(hermesstate.Message{SessionID: "20261201_100000_abcdef", Role: "user", Content: "step", Timestamp: 1_790_000_001 + float64(i)})
	}
	d := newDash(t, dashOptions{home: home})
	e := d.as("ada")
	var seen int
	target := "/orgs/acme/sessions/20261201_100000_abcdef"
	for pages := 1; ; pages++ {
		doc := page(t, e, target, "/orgs/acme")
		n := testid(doc, "message").Length()
		seen += n
		if pages > 1 && testid(doc, "transcript-first").Length() != 1 {
			t.Fatalf("page %d has no way back to the first messages", pages)
		}
		next, ok := testid(doc, "transcript-next").Attr("href")
		if !ok {
			if pages != 3 || n != 50 {
				t.Fatalf("the last page is page %d with %d messages", pages, n)
			}
			break
		}
		if n != 200 {
			t.Fatalf("page %d shows %d messages, want 200", pages, n)
		}
		target = next
	}
	if seen != 450 {
		t.Fatalf("%d messages over the pages, want 450", seen)
	}
	e.GET("/orgs/acme/sessions/20261201_100000_abcdef").WithQuery("after", "-4").Expect().Status(400)
}
