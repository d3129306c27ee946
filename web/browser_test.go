package web_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"hermeshost/internal/hosttest"
)

// An operator in a real browser: sent to the login page, a wrong password refused, logged
// in to the index of their orgs, which htmx refreshes in place as the job mirror changes,
// and logged out.
func TestOperatorLogsInAndWatchesTheirOrgsInABrowser(t *testing.T) {
	f := newFixture(t, 1)
	ctx, pageErrors := hosttest.Headless(t, 90*time.Second)
	css := func(s string) chromedp.CSS { return chromedp.CSS(s) }
	// text reads an element's text in one evaluation in the page: htmx swaps the org table
	// out every second, so a node found by one protocol call may be gone by the next.
	text := func(sel string) string {
		t.Helper()
		q, _ := json.Marshal(sel)
		s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(document.querySelector(`+string(q)+`) || {textContent: ""}).textContent`))
		if err != nil {
			t.Fatalf("read %s: %v", sel, err)
		}
		return strings.TrimSpace(s)
	}
	err := chromedp.Do(ctx,
		chromedp.Navigate(f.srv.URL+"/"),
		chromedp.WaitVisible(css(`[data-testid="login-form"]`)),
	)
	if err != nil {
		t.Fatal(err)
	}
	location, err := chromedp.Run(ctx, chromedp.Location())
	if err != nil || !strings.HasSuffix(location, "/login?next=%2F") {
		t.Fatalf("an anonymous visit landed on %s (%v)", location, err)
	}
	err = chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.ID("name"), "ada"),
		chromedp.SendKeys(chromedp.ID("password"), "not the password"),
		chromedp.Click(css(`[data-testid="login-submit"]`)),
		chromedp.WaitVisible(css(`[data-testid="login-error"]`)),
	)
	if err != nil {
		t.Fatal(err)
	}
	if got := text(`[data-testid="login-error"]`); got != "Wrong name or password." {
		t.Fatalf("the refusal reads %q", got)
	}
	err = chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.ID("password"), password),
		chromedp.Click(css(`[data-testid="login-submit"]`)),
		// The header, which htmx never swaps (the org table it swaps every second).
		chromedp.WaitVisible(css(`[data-testid="operator"]`)),
	)
	if err != nil {
		t.Fatal(err)
	}
	if got := text(`[data-testid="operator"]`); got != "ada" {
		t.Fatalf("logged in as %q", got)
	}
	if got := text(`[data-testid="org-globex"] .org`); got != "globex" {
		t.Fatalf("globex's row reads %q", got)
	}
	if got := text(`[data-testid="org-acme"] [data-testid="running"]`); got != "1" {
		t.Fatalf("acme's running jobs read %q, want 1", got)
	}
	// A job starts running: htmx brings the new count in without a reload.
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[string](`window.stillThisPage = "yes"`)); err != nil {
		t.Fatal(err)
	}
	f.job("acme", "j6", "RUNNING")
	deadline := time.Now().Add(15 * time.Second)
	for text(`[data-testid="org-acme"] [data-testid="running"]`) != "2" {
		if time.Now().After(deadline) {
			t.Fatal("the org table did not refresh to show the new running job")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if marker, err := chromedp.Run(ctx, chromedp.Evaluate[string](`window.stillThisPage || "reloaded"`)); err != nil || marker != "yes" {
		t.Fatalf("the page was reloaded instead of refreshed in place: %q %v", marker, err)
	}
	err = chromedp.Do(ctx,
		chromedp.Click(css(`[data-testid="logout"]`)),
		chromedp.WaitVisible(css(`[data-testid="login-form"]`)),
		chromedp.Navigate(f.srv.URL+"/"),
		chromedp.WaitVisible(css(`[data-testid="login-form"]`)),
	)
	if err != nil {
		t.Fatal(err)
	}
	// Chromium logs the refused login's 401 as a failed resource; anything else is a fault
	// of the page (a script refused by the CSP, an error thrown).
	for _, e := range pageErrors() {
		if !strings.Contains(e, "401") {
			t.Errorf("the page logged an error: %s", e)
		}
	}
}
