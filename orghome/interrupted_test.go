package orghome

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"hermeshost/internal/statetest"
	"hermeshost/orghome/hermesstate"
)

// A Hermes killed mid-write leaves a hot journal that only a read-write open rolls back.
// The host, read-only, says so (pages, skill usage) instead of failing, leaves the files as
// they are, and reads again once Hermes has opened the database.
func TestAWriteHermesDidNotFinishIsReportedAndLeftForHermesToRecover(t *testing.T) {
	_, h := newHome(t, "acme")
	stateFixture(t, h, 3).Close()
	path := filepath.Join(h.Dir, StateFile)
	statetest.InterruptWrite(t, path)
	ctx := context.Background()

	st, err := h.OpenState()
	must(t, err)
	page, err := st.Sessions(ctx, SessionQuery{})
	if err != nil || page.Status != StatusInterrupted || len(page.Sessions) != 0 {
		t.Fatalf("sessions over a hot journal: %+v, %v; want Status %q", page, err, StatusInterrupted)
	}
	tr, err := st.Transcript(ctx, "s00001")
	if err != nil || tr.Status != StatusInterrupted {
		t.Fatalf("transcript over a hot journal: %+v, %v; want Status %q", tr, err, StatusInterrupted)
	}
	_, err = h.SkillUsage(ctx, nil)
	if !errors.Is(err, ErrStateInterrupted) || !errors.Is(err, ErrStateBusy) {
		t.Fatalf("skill usage over a hot journal: %v; want ErrStateInterrupted, an ErrStateBusy", err)
	}
	must(t, st.Close())
	if fi, err := os.Stat(path + "-journal"); err != nil || fi.Size() == 0 {
		t.Fatalf("the host touched the journal Hermes must roll back: %v", err)
	}

	// Hermes' next start opens it read-write, which rolls the cut-off write back.
	db, err := hermesstate.Create(ctx, path)
	must(t, err)
	must(t, db.Close())
	st, err = h.OpenState()
	must(t, err)
	defer st.Close()
	page, err = st.Sessions(ctx, SessionQuery{})
	if err != nil || page.Status != "" || len(page.Sessions) != 3 {
		t.Fatalf("sessions once Hermes opened state.db: %+v, %v; want the 3 committed", page, err)
	}
	if _, err := h.SkillUsage(ctx, nil); err != nil {
		t.Fatalf("skill usage once Hermes opened state.db: %v", err)
	}
}
