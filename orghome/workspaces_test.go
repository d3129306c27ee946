package orghome

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestPruneWorkspacesByAgeAndCountKeepsActiveJobs(t *testing.T) {
	_, h := newHome(t, "acme")
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	outside := writeFile(t, t.TempDir(), "precious.txt", "keep")
	// job-0 is newest, job-5 oldest: job-i was last touched i days ago.
	for i := range 6 {
		dir := filepath.Join(h.Dir, "workspaces", fmt.Sprintf("job-%d", i))
		writeFile(t, dir, "manifest.json", "{}")
		if i == 4 {
			symlink(t, outside, filepath.Join(dir, "link-out"))
			symlink(t, filepath.Dir(outside), filepath.Join(dir, "dir-out"))
		}
		at := now.Add(-time.Duration(i) * 24 * time.Hour)
		if err := os.Chtimes(dir, at, at); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, h.Dir, "workspaces/stray-file", "not a workspace")
	must(t, os.Mkdir(filepath.Join(h.Dir, "workspaces", "-bad-name"), 0o755))

	list, err := h.Workspaces()
	if err != nil || len(list) != 6 || list[0].JobID != "job-0" || list[5].JobID != "job-5" {
		t.Fatalf("workspaces = %+v, %v", list, err)
	}

	// Keep 3 days and at most 2; job-5 is still running.
	removed, err := h.PruneWorkspaces(Retention{MaxAge: 72 * time.Hour, MaxCount: 2}, now, "job-5")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, w := range removed {
		ids = append(ids, w.JobID)
	}
	if fmt.Sprint(ids) != "[job-2 job-3 job-4]" {
		t.Fatalf("removed %v; want the ones past the count and age, not the active job", ids)
	}
	left, _ := h.Workspaces()
	if len(left) != 3 {
		t.Fatalf("left = %+v", left)
	}
	if b, err := os.ReadFile(outside); err != nil || string(b) != "keep" {
		t.Fatalf("a link's target outside the home was touched: %q, %v", b, err)
	}
	for _, stray := range []string{"stray-file", "-bad-name"} {
		if _, err := os.Lstat(filepath.Join(h.Dir, "workspaces", stray)); err != nil {
			t.Errorf("%s, not a workspace, was removed: %v", stray, err)
		}
	}
}

func TestWorkspacePathRefusesBadJobIDs(t *testing.T) {
	if p, err := WorkspacePath("0b7e2f1c-job"); err != nil || p != "workspaces/0b7e2f1c-job" {
		t.Fatalf("WorkspacePath = %q, %v", p, err)
	}
	for _, bad := range []string{"", "..", "../x", "a/b", "-x", ".hidden"} {
		if _, err := WorkspacePath(bad); !errors.Is(err, ErrInvalidJobID) {
			t.Errorf("WorkspacePath(%q): %v", bad, err)
		}
	}
}

func TestNoWorkspacesFolderIsNoWorkspaces(t *testing.T) {
	_, h := newHome(t, "acme")
	if list, err := h.Workspaces(); err != nil || list != nil {
		t.Fatalf("workspaces = %v, %v", list, err)
	}
}
