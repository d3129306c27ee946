package web_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"

	"hermeshost/assertion"
	"hermeshost/internal/hosttest"
	"hermeshost/lease"
)

func TestLeasesAreShownWithTheirEventsAndForceReleasedAfterAReason(t *testing.T) {
	acme, _ := twoHomes(t, 0)
	d := newDash(t, dashOptions{home: acme})
	ctx := context.Background()
	home, err := d.control.Acquire(ctx, "home:acme", "worker-acme-1", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.control.Acquire(ctx, "session:chat-7", "chat-turn-3", time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"home:globex", "org:acme", "session:globex.chat-7"} {
		if _, err := d.leases.TryAcquire(ctx, key, "not-acmes", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	e := d.as("ada")

	body := get(e, "/orgs/acme/leases").Expect().Status(http.StatusOK).Body().Raw()
	p := doc(t, body, "/orgs/acme")
	if got := texts(testid(p, "lease-key")); !strings.Contains(strings.Join(got, ","), "home:acme") {
		t.Errorf("leases %v", got)
	}
	for _, leak := range []string{"globex", "not-acmes", "org:acme"} {
		if strings.Contains(body, leak) {
			t.Errorf("the leases page shows %q", leak)
		}
	}
	if got := texts(testid(p, "lease-event-kind")); len(got) == 0 || got[0] != "acquire" {
		t.Errorf("events %v", got)
	}
	homeRow := testid(p, "lease").FilterFunction(func(_ int, s *goquery.Selection) bool {
		return s.Find(`[data-testid="lease-key"]`).Text() == "home:acme"
	})
	if got := homeRow.Find(`[data-testid="lease-holder"]`).Text(); !strings.Contains(got, "worker-acme-1") {
		t.Errorf("home:acme's holder %q", got)
	}
	confirm, _ := homeRow.Find(`[data-testid="lease-force-release"]`).Attr("href")
	if want := "/orgs/acme/leases?" + (url.Values{"confirm": {"home:acme"}}).Encode(); confirm != want {
		t.Fatalf("Force release links %q", confirm)
	}
	// The confirmation asks for a reason; the key is a form value, not a URL.
	p = page(t, e, confirm, "/orgs/acme")
	form := testid(p, "force-release-form")
	if action, _ := form.Attr("action"); action != "/orgs/acme/leases/force-release" {
		t.Errorf("the form posts to %q", action)
	}
	if key, _ := form.Find(`input[name="key"]`).Attr("value"); key != "home:acme" {
		t.Errorf("the form's key %q", key)
	}
	if _, required := testid(p, "force-release-reason").Attr("required"); !required {
		t.Error("the reason is not required")
	}

	// No reason: asked again, nothing released.
	r := e.POST("/orgs/acme/leases/force-release").WithFormField("key", "home:acme").WithFormField("reason", " ").Expect().Status(http.StatusBadRequest)
	p = doc(t, r.Body().Raw(), "/orgs/acme")
	if !strings.Contains(testid(p, "leases-notice").Text(), "Give a reason") || testid(p, "force-release-form").Length() != 1 {
		t.Errorf("no reason: %s", testid(p, "leases-notice").Text())
	}
	if info, _ := d.leases.Holder(ctx, "home:acme"); info.Epoch != home.Epoch || info.Holder != "worker-acme-1" {
		t.Fatalf("released without a reason: %+v", info)
	}

	// Released: back to the page, which says so; the epoch moved on, the old holder's fenced
	// write is refused, and the event names the operator and the reason.
	e.POST("/orgs/acme/leases/force-release").WithFormField("key", "home:acme").WithFormField("reason", hostile).
		Expect().Status(http.StatusSeeOther).Header("Location").IsEqual("/orgs/acme/leases?released=home%3Aacme")
	info, err := d.leases.Holder(ctx, "home:acme")
	if err != nil || info.Holder != "" || info.Epoch != home.Epoch+1 {
		t.Fatalf("after the force release: %+v %v", info, err)
	}
	wrote := false
	err = d.leases.WithFence(ctx, lease.Lease{Key: "home:acme", Holder: "worker-acme-1", Epoch: home.Epoch}, func(pgx.Tx) error {
		wrote = true
		return nil
	})
	if !errors.Is(err, lease.ErrLost) || wrote {
		t.Fatalf("the old holder's fenced write: %v (ran: %v)", err, wrote)
	}
	evs, err := d.leases.Events(ctx, "home:acme", 1)
	if err != nil || evs[0].Kind != lease.KindForceRelease || evs[0].Actor != "operator:ada" || evs[0].Reason != hostile {
		t.Fatalf("the event %+v %v", evs, err)
	}
	p = page(t, e, "/orgs/acme/leases?released=home%3Aacme", "/orgs/acme")
	if got := testid(p, "leases-notice").Text(); !strings.Contains(got, "Released home:acme by force") {
		t.Errorf("notice %q", got)
	}
	if got := texts(testid(p, "lease-event-reason")); len(got) == 0 || got[0] != hostile {
		t.Errorf("reasons %q", got)
	}

	// Again: nobody holds it, and the page says so.
	r = e.POST("/orgs/acme/leases/force-release").WithFormField("key", "home:acme").WithFormField("reason", "again").Expect().Status(http.StatusConflict)
	if got := testid(doc(t, r.Body().Raw(), "/orgs/acme"), "leases-notice").Text(); !strings.Contains(got, "Nobody holds") {
		t.Errorf("second release %q", got)
	}
	// A POST without the launcher's assertion does nothing.
	if _, err := d.control.Acquire(ctx, "home:acme", "worker-acme-2", time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	d.anonymous().POST("/orgs/acme/leases/force-release").WithFormField("key", "home:acme").WithFormField("reason", "x").
		Expect().Status(http.StatusUnauthorized)
	if info, _ := d.leases.Holder(ctx, "home:acme"); info.Holder != "worker-acme-2" {
		t.Fatalf("an anonymous POST released it: %+v", info)
	}
}

func TestAnotherOrgsLeaseAndOrgLeasesCannotBeForceReleasedThroughThisDashboard(t *testing.T) {
	acme, _ := twoHomes(t, 0)
	d := newDash(t, dashOptions{home: acme})
	ctx := context.Background()
	keys := []string{"home:globex", "org:acme", "org:globex", "session:globex.chat-7"}
	epochs := map[string]int64{}
	for _, key := range keys {
		l, err := d.leases.TryAcquire(ctx, key, "not-acmes", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		epochs[key] = l.Epoch
	}
	e := d.as("ada")
	for _, key := range []string{"home:globex", "org:acme", "org:globex"} {
		e.POST("/orgs/acme/leases/force-release").WithFormField("key", key).WithFormField("reason", "mine now").
			Expect().Status(http.StatusForbidden).Body().Contains("only this organization")
	}
	// session:globex.chat-7 named by acme is acme's session "globex.chat-7", never taken.
	e.POST("/orgs/acme/leases/force-release").WithFormField("key", "session:globex.chat-7").WithFormField("reason", "mine now").
		Expect().Status(http.StatusNotFound)
	for _, key := range keys {
		info, err := d.leases.Holder(ctx, key)
		if err != nil || info.Holder != "not-acmes" || info.Epoch != epochs[key] {
			t.Errorf("%s after the refused releases: %+v %v", key, info, err)
		}
		if evs, _ := d.leases.Events(ctx, key, 10); len(evs) != 1 {
			t.Errorf("%s has events %+v", key, evs)
		}
	}
}

func TestTheLeasesPageSaysWhatToDoWithNone(t *testing.T) {
	other := newOrgHome(t, filepath.Join(t.TempDir(), "orgs"), "initech", 0)
	p := page(t, newDash(t, dashOptions{home: other}).as("ada"), "/orgs/initech/leases", "/orgs/initech")
	if got := testid(p, "leases-none").Text(); !strings.Contains(got, "run a job") {
		t.Errorf("empty state %q", got)
	}
}

// The leases page follows the org's leases on its own stream: a lease taken or released
// elsewhere changes the table in an open browser within a second or so, without a reload.
func TestTheLeasesPageFollowsTheLeasesLive(t *testing.T) {
	acme, _ := twoHomes(t, 0)
	d := newDash(t, dashOptions{home: acme})
	ctx := context.Background()
	p := page(t, d.as("ada"), "/orgs/acme/leases", "/orgs/acme")
	if got := testid(p, "live").AttrOr("sse-connect", ""); !strings.HasPrefix(got, "/orgs/acme/leases/events?after=") {
		t.Fatalf("the leases page connects to %q", got)
	}
	browser, pageErrors := hosttest.Headless(t, 90*time.Second)
	ahead, _ := assertion.NewSigner(dashSecret, func() time.Time { return time.Now().Add(3 * time.Minute) })
	tok, err := ahead.Sign("ada", "acme")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(browser, network.Enable, network.EnableParams{}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(browser, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: network.Headers{assertion.Header: tok}}); err != nil {
		t.Fatal(err)
	}
	eval := func(js string) string {
		t.Helper()
		v, err := chromedp.Run(browser, chromedp.Evaluate[string](js))
		if err != nil {
			t.Fatalf("%s: %v", js, err)
		}
		return v
	}
	poll := func(js string, within time.Duration) error {
		return chromedp.Do(browser, chromedp.Poll[chromedp.Void](js, chromedp.WithPollingTimeout(within)))
	}
	if err := chromedp.Do(browser, chromedp.Navigate(d.srv.URL+"/orgs/acme/leases"), chromedp.WaitVisible(chromedp.CSS(`[data-testid="leases-none"]`))); err != nil {
		t.Fatal(err)
	}
	for d.metric("hermes_dashboard_lease_live_subscribers") < 1 {
		if err := poll(`true`, time.Second); err != nil {
			t.Fatal(err)
		}
	}
	eval(`window.stillThisPage = "yes"`)
	holder := `[...document.querySelectorAll('[data-testid="lease-holder"]')].map(e => e.textContent.trim()).join(",")`
	l, err := d.control.Acquire(ctx, "home:acme", "worker-acme-9", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := poll(holder+` === "worker-acme-9"`, 5*time.Second); err != nil {
		t.Fatalf("the taken lease did not show: %q, %v (page errors %v)", eval(holder), err, pageErrors())
	}
	if err := d.control.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	if err := poll(holder+` === "free"`, 5*time.Second); err != nil {
		t.Fatalf("the released lease did not show free: %q, %v", eval(holder), err)
	}
	if got := eval(`document.querySelector('[data-testid="lease-event-kind"]').textContent`); got != "release" {
		t.Errorf("the newest event shown is %q", got)
	}
	if still := eval(`window.stillThisPage || "reloaded"`); still != "yes" {
		t.Fatal("the page reloaded instead of swapping the table")
	}
	if errs := pageErrors(); len(errs) > 0 {
		t.Fatalf("the page logged errors: %v", errs)
	}
}
