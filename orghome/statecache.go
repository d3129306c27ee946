package orghome

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"
)

// sharedState is the one StateDB a long-lived reader (a dashboard) keeps for its home:
// opening state.db costs a SQLite open and a read of its layout, more than the page the
// operator asked for. It is replaced when state.db is replaced (another inode).
type sharedState struct {
	mu sync.Mutex
	st *StateDB
	fi fs.FileInfo
}

// State is the home's state.db, opened once and kept open for further calls: do not Close
// it (the home's Close does). ErrNoSessions while the home has none; a state.db that
// appears later, or replaces the one open, is opened on the next call. Its answers may be
// shared between callers: read them, never modify them.
func (h *Home) State() (*StateDB, error) {
	h.shared.mu.Lock()
	defer h.shared.mu.Unlock()
	fi, err := h.Lstat(StateFile)
	if errors.Is(err, fs.ErrNotExist) {
		h.dropShared()
		return nil, fmt.Errorf("org %s: %w", h.ID, ErrNoSessions)
	}
	if err != nil {
		return nil, fmt.Errorf("open sessions: %w", err)
	}
	if h.shared.st != nil && os.SameFile(fi, h.shared.fi) {
		return h.shared.st, nil
	}
	h.dropShared()
	st, err := h.OpenState()
	if err != nil {
		return nil, err
	}
	st.cache = newResultCache()
	h.shared.st, h.shared.fi = st, fi
	return st, nil
}

func (h *Home) dropShared() {
	if h.shared.st != nil {
		h.shared.st.Close()
		h.shared.st, h.shared.fi = nil, nil
	}
}

// resultCache keeps the answers of a shared StateDB while the database is unchanged, as
// SQLite's data_version on a connection of its own says: any commit by another connection
// or process (Hermes writing a message) changes it, and the cache is emptied. A page of an
// idle home is then rendered from memory; a home an agent is writing costs its queries.
type resultCache struct {
	mu      sync.Mutex
	conn    *sql.Conn
	version int64
	entries map[string]any
}

// resultCacheSize bounds the answers kept (a transcript page is the largest, ~200 messages).
const resultCacheSize = 32

func newResultCache() *resultCache { return &resultCache{entries: map[string]any{}} }

// check empties the cache when the database changed since the last check; an error leaves
// it unusable for this call (ok false), and the caller reads the database.
func (c *resultCache) check(ctx context.Context, db *sql.DB) bool {
	if c.conn == nil {
		conn, err := db.Conn(ctx)
		if err != nil {
			return false
		}
		c.conn = conn
	}
	var v int64
	if err := c.conn.QueryRowContext(ctx, "PRAGMA data_version").Scan(&v); err != nil {
		c.conn.Close()
		c.conn = nil
		clear(c.entries)
		return false
	}
	if v != c.version {
		c.version = v
		clear(c.entries)
	}
	return true
}

// cached returns the answer for key, computing it with read on a miss. Only answers read
// without error are kept; a busy answer (Status set) is not either.
func cached[T any](ctx context.Context, s *StateDB, key string, keep func(T) bool, read func() (T, error)) (T, error) {
	c := s.cache
	if c == nil {
		return read()
	}
	c.mu.Lock()
	ok := c.check(ctx, s.db)
	if ok {
		if v, hit := c.entries[key]; hit {
			c.mu.Unlock()
			return v.(T), nil
		}
	}
	c.mu.Unlock()
	v, err := read()
	if err != nil || !ok || !keep(v) {
		return v, err
	}
	c.mu.Lock()
	if len(c.entries) >= resultCacheSize {
		clear(c.entries)
	}
	c.entries[key] = v
	c.mu.Unlock()
	return v, nil
}

func (c *resultCache) close() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil {
		c.conn.Close()
		c.conn = nil
	}
}
