package control

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func (f *fixture) client(key string) *Client {
	f.t.Helper()
	c, err := NewClient(f.srv.URL, key, f.srv.Client())
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

func TestClientRoundTrips(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	base := f.now()
	for i := range 7 {
		f.addJob(orgA, fmt.Sprintf("a-%d", i), base.Add(time.Duration(i)*time.Second), i)
		f.addJob(orgB, fmt.Sprintf("b-%d", i), base.Add(time.Duration(i)*time.Second), 1)
	}
	a := f.client(f.key(orgA))

	var ids []string
	cursor := ""
	for {
		page, err := a.Jobs(ctx, 3, cursor)
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range page.Jobs {
			ids = append(ids, j.ID)
		}
		if cursor = page.NextCursor; cursor == "" {
			break
		}
	}
	if got := strings.Join(ids, ","); got != "a-6,a-5,a-4,a-3,a-2,a-1,a-0" {
		t.Fatalf("jobs: %s", got)
	}
	d, err := a.Job(ctx, "a-3")
	if err != nil || d.Job.ID != "a-3" || len(d.Events) != 3 || d.Truncated {
		t.Fatalf("job: %+v %v", d, err)
	}
	if _, err := a.Job(ctx, "b-3"); !IsNotFound(err) {
		t.Fatalf("B's job: %v", err)
	}
	if _, err := a.Job(ctx, "a/../b-3"); !IsNotFound(err) {
		t.Fatalf("a job id with slashes: %v", err)
	}

	l, err := a.Acquire(ctx, "session:chat-1", "turn-1", time.Minute, 0)
	if err != nil || l.Key != "session:chat-1" || l.Holder != "turn-1" || l.Epoch != 1 {
		t.Fatalf("acquire: %+v %v", l, err)
	}
	_, err = a.Acquire(ctx, "session:chat-1", "turn-2", time.Minute, 0)
	var apiErr *APIError
	if !IsHeld(err) || !errors.As(err, &apiErr) || apiErr.HeldBy == nil || apiErr.HeldBy.Holder != "turn-1" ||
		apiErr.HeldBy.Key != "session:chat-1" || apiErr.HeldBy.Epoch != 1 || !apiErr.HeldBy.ExpiresAt.Equal(l.ExpiresAt) {
		t.Fatalf("held: %v (%+v)", err, apiErr)
	}
	r, err := a.Refresh(ctx, l, time.Hour)
	if err != nil || !r.AcquiredAt.Equal(l.AcquiredAt) || !r.ExpiresAt.After(l.ExpiresAt) {
		t.Fatalf("refresh: %+v %v", r, err)
	}
	info, err := a.Holder(ctx, "session:chat-1")
	if err != nil || !info.Held || info.Holder != "turn-1" || info.Epoch != 1 || !info.ExpiresAt.Equal(r.ExpiresAt) {
		t.Fatalf("holder: %+v %v", info, err)
	}
	if err := a.Release(ctx, r); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Refresh(ctx, r, time.Minute); !IsLost(err) {
		t.Fatalf("refresh after release: %v", err)
	}
	if _, err := a.Holder(ctx, "session:never"); !IsNotFound(err) {
		t.Fatalf("unknown lease: %v", err)
	}
	for _, key := range []string{"home:globex", "org:acme"} {
		if _, err := a.Acquire(ctx, key, "turn-1", time.Minute, 0); !IsForbidden(err) {
			t.Fatalf("%s: %v", key, err)
		}
	}

	// A waiting acquire gets the lease when the holder releases.
	home, err := a.Acquire(ctx, "home:acme", "worker-1", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		l, err := a.Acquire(ctx, "home:acme", "worker-2", time.Minute, testMaxWait)
		if err == nil && (l.Holder != "worker-2" || l.Epoch != home.Epoch+1) {
			err = fmt.Errorf("waited for %+v", l)
		}
		got <- err
	}()
	if err := a.Release(ctx, home); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if _, err := a.Acquire(ctx, "home:acme", "worker-3", time.Minute, testMaxWait+time.Millisecond); err == nil || IsHeld(err) {
		t.Fatalf("a wait over the maximum: %v", err)
	}
}

func TestClientErrorsNeverContainTheKey(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	key := f.key(orgA)
	mac := strings.TrimPrefix(key, "hck_acme_")
	a := f.client(key)
	wrong, _ := Key("another-secret", orgA)
	var errs []error
	collect := func(err error) {
		t.Helper()
		if err == nil {
			t.Fatal("no error")
		}
		errs = append(errs, err)
	}

	_, err := f.client(wrong).Jobs(ctx, 0, "")
	if e := apiError(err); e == nil || e.Status != http.StatusUnauthorized || e.Code != CodeUnauthorized {
		t.Fatalf("wrong key: %v", err)
	}
	collect(err)
	_, err = a.Acquire(ctx, "home:globex", "w", time.Minute, 0)
	collect(err)
	_, err = a.Refresh(ctx, Lease{Key: "home:acme", Holder: "w", Epoch: 1}, time.Minute)
	collect(err)
	_, err = a.Acquire(ctx, "home:acme", "", time.Minute, 0)
	collect(err)
	_, err = a.Job(ctx, "nope")
	collect(err)

	// A server in between that echoes what it was sent.
	echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/jobs" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadGateway)
			fmt.Fprintf(w, `{"error":"bad_gateway","message":"upstream refused %s"}`, r.Header.Get("Authorization"))
			return
		}
		w.WriteHeader(http.StatusBadGateway)
		fmt.Fprintf(w, "<html>bad gateway for %s</html>", r.Header.Get("Authorization"))
	}))
	ec, err := NewClient(echo.URL, key, echo.Client())
	if err != nil {
		t.Fatal(err)
	}
	_, err = ec.Jobs(ctx, 0, "")
	collect(err)
	_, err = ec.Holder(ctx, "home:acme")
	collect(err)
	echo.Close()
	// Nothing listens any more: a transport error.
	_, err = ec.Jobs(ctx, 0, "")
	collect(err)

	for _, bad := range []string{key + "\n", "Bearer " + key, mac} {
		_, err := NewClient(f.srv.URL, bad, nil)
		collect(err)
	}
	_, err = NewClient("http://user:"+key+"@127.0.0.1:1", key, nil)
	collect(err)

	for _, err := range errs {
		for _, form := range []string{err.Error(), fmt.Sprintf("%+v", err), fmt.Sprintf("%#v", err)} {
			if strings.Contains(form, mac) {
				t.Errorf("an error holds the key: %s", form)
			}
		}
	}
}

func TestNewClientRefusesBadBaseURLs(t *testing.T) {
	key, _ := Key(testSecret, orgA)
	for _, u := range []string{"", "127.0.0.1:8080", "ftp://host", "http://", "http://host/?x=1", "http://host/#f"} {
		if _, err := NewClient(u, key, nil); err == nil {
			t.Errorf("%q accepted", u)
		}
	}
	if c, err := NewClient("http://127.0.0.1:8080/control/", key, nil); err != nil || c.base != "http://127.0.0.1:8080/control" {
		t.Fatalf("a base with a path: %+v %v", c, err)
	}
}
