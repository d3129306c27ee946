package worker

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"sync"

	"hermeshost/atomicfile"
)

// CheckpointFile holds, in the job workspace, the categories already persisted through the
// write surface. The agent reads it to skip them; the worker writes it atomically after each
// accepted write, so a crash loses at most the write in flight (which the backend keeps
// anyway, and a re-claim learns from the job's event log).
const CheckpointFile = "checkpoint.json"

// Checkpoint is the durable record of a job's persisted categories.
type Checkpoint struct {
	mu   sync.Mutex
	path string
	data checkpointData
}

type checkpointData struct {
	JobID      string   `json:"job_id"`
	Categories []string `json:"categories"`
	// Session is the agent's session that stopped at its turn limit and is resumed, and
	// TurnLimits how often a run of this job stopped there: what an operator reading the
	// workspace needs to follow a long job.
	Session    string `json:"session,omitempty"`
	TurnLimits int    `json:"turn_limits,omitempty"`
}

// Validate refuses a checkpoint of another job.
func (d *checkpointData) Validate() error {
	if d.JobID == "" {
		return errors.New("checkpoint names no job")
	}
	return nil
}

// OpenCheckpoint loads the workspace's checkpoint for job, or starts an empty one. A
// checkpoint that exists but cannot be read is an error, never an empty start: an empty
// start would re-propose what is already persisted.
func OpenCheckpoint(workspace, job string) (*Checkpoint, error) {
	c := &Checkpoint{path: filepath.Join(workspace, CheckpointFile), data: checkpointData{JobID: job}}
	err := atomicfile.LoadJSON(c.path, &c.data)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		c.data = checkpointData{JobID: job, Categories: []string{}}
		return c, c.save()
	case err != nil:
		return nil, fmt.Errorf("checkpoint of job %s: %w", job, err)
	case c.data.JobID != job:
		return nil, fmt.Errorf("checkpoint in %s is of job %s, not %s", workspace, c.data.JobID, job)
	}
	return c, nil
}

// Add records categories as persisted (once each) and writes the checkpoint.
func (c *Checkpoint) Add(categories ...string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	changed := false
	for _, cat := range categories {
		if !slices.Contains(c.data.Categories, cat) {
			c.data.Categories = append(c.data.Categories, cat)
			changed = true
		}
	}
	if !changed {
		return nil
	}
	return c.save()
}

// TurnLimit records that a run stopped at its turn limit and session is resumed.
func (c *Checkpoint) TurnLimit(session string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.data.Session = session
	c.data.TurnLimits++
	return c.save()
}

// Categories is what is persisted so far.
func (c *Checkpoint) Categories() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.data.Categories)
}

func (c *Checkpoint) save() error {
	b, err := jsonIndent(c.data)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(c.path, b, 0o600); err != nil {
		return fmt.Errorf("save checkpoint of job %s: %w", c.data.JobID, err)
	}
	return nil
}
