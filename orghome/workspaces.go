package orghome

import (
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"time"
)

// Job workspaces live inside the home, at <home>/workspaces/<job-id>, mounted into the
// org's container as /workspaces. Inside the home rather than beside it because a sibling
// such as ORGS_ROOT/<org>-workspaces could be the home of another valid org id, and because
// one os.Root then covers everything an org owns.
const workspacesDir = "workspaces"

var jobIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// ErrInvalidJobID is returned for a job id that cannot name a workspace folder.
var ErrInvalidJobID = errors.New("invalid job id")

// ValidJobID reports whether a job id may name a workspace folder.
func ValidJobID(id string) error {
	if !jobIDPattern.MatchString(id) {
		return fmt.Errorf("%w %q: want 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit", ErrInvalidJobID, id)
	}
	return nil
}

// WorkspacePath is where the job's workspace is, relative to the home.
func WorkspacePath(jobID string) (string, error) {
	if err := ValidJobID(jobID); err != nil {
		return "", err
	}
	return workspacesDir + "/" + jobID, nil
}

// Workspace is one job's folder.
type Workspace struct {
	JobID   string
	ModTime time.Time // of the folder: when an entry was last added or removed at its top
}

// Workspaces lists the home's job workspaces, newest first. Entries that are not a folder
// named by a job id are left out: the host neither shows nor removes what it did not make.
func (h *Home) Workspaces() ([]Workspace, error) {
	entries, err := h.ReadDir(workspacesDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list workspaces: %w", err)
	}
	var out []Workspace
	for _, e := range entries {
		if !e.IsDir() || ValidJobID(e.Name()) != nil {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue // removed while listing
		}
		out = append(out, Workspace{JobID: e.Name(), ModTime: fi.ModTime()})
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].ModTime.Equal(out[j].ModTime) {
			return out[i].ModTime.After(out[j].ModTime)
		}
		return out[i].JobID > out[j].JobID
	})
	return out, nil
}

// Retention is how long and how many workspaces are kept.
type Retention struct {
	MaxAge   time.Duration // older than this goes; 0 keeps any age
	MaxCount int           // beyond the newest this many goes; 0 keeps any number
}

// PruneWorkspaces removes the workspaces past the retention, except those of the jobs in
// active (a job still running keeps its folder whatever its age). It returns what it
// removed. Removal goes through the home's os.Root, so a symlink inside a workspace is
// removed as a link and its target is never touched.
func (h *Home) PruneWorkspaces(r Retention, now time.Time, active ...string) ([]Workspace, error) {
	list, err := h.Workspaces()
	if err != nil {
		return nil, err
	}
	keep := map[string]bool{}
	for _, id := range active {
		keep[id] = true
	}
	var removed []Workspace
	kept := 0
	for _, w := range list {
		if keep[w.JobID] {
			kept++
			continue
		}
		tooOld := r.MaxAge > 0 && now.Sub(w.ModTime) > r.MaxAge
		tooMany := r.MaxCount > 0 && kept >= r.MaxCount
		if !tooOld && !tooMany {
			kept++
			continue
		}
		name := workspacesDir + "/" + w.JobID
		if err := h.root.RemoveAll(name); err != nil {
			return removed, h.wrapPath("remove workspace", name, err)
		}
		h.Log.Info("workspace removed", "org", h.ID, "job", w.JobID, "modified", w.ModTime, "too_old", tooOld, "too_many", tooMany)
		removed = append(removed, w)
	}
	return removed, nil
}
