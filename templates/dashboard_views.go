package templates

import (
	"crypto/sha256"
	"encoding/hex"
	"net/url"
	"strconv"

	"github.com/a-h/templ"
)

// DashboardFrame is what every dashboard page's frame shows: whose dashboard, who is
// looking (from the launcher's assertion), and which page of the navigation is open.
type DashboardFrame struct {
	Paths    Paths
	Org      string
	Operator string
	Active   string // one of the Nav* names
}

// The pages of the dashboard's navigation.
const (
	NavOverview  = "overview"
	NavSessions  = "sessions"
	NavMemory    = "memory"
	NavSkills    = "skills"
	NavJobs      = "jobs"
	NavSubagents = "subagents"
	NavLeases    = "leases"
)

// OverviewView is the dashboard's first page: who the agent is, what runs, who holds the
// home. Each part carries its own error, so one source that fails leaves the rest shown.
type OverviewView struct {
	Frame    DashboardFrame
	Identity IdentityView
	Jobs     JobsView
	Leases   LeasesView
	Gateway  GatewayView
}

// IdentityView is SOUL.md: the host's generated block and the free section.
type IdentityView struct {
	Error          string // SOUL.md could not be read
	Exists         bool
	Version        int // of the generated block; 0 without one
	CurrentVersion int // the version this host writes
	Intact         bool
	Problem        string // what the next agent start puts right
	Block          string
	Free           string
}

// JobsView is the org's jobs from the control API's job mirror.
type JobsView struct {
	Error   string // the control API did not answer
	Current []JobRow
	Recent  []JobRow
}

// JobRow is one mirrored job.
type JobRow struct {
	ID      string
	Type    string
	Status  string
	Attempt int
	Error   string
	Updated string
	Link    templ.SafeURL // the job's page
}

// LeasesView is the org's held leases (home: and session:) from the control API.
type LeasesView struct {
	Error     string
	Rows      []LeaseRow
	Truncated bool
}

// LeaseRow is one held lease.
type LeaseRow struct {
	Key    string
	Holder string
	Epoch  int64
	Since  string
	Until  string
}

// GatewayView is whether the model gateway answers /v1/models with the org's key, which
// the dashboard's chat will use.
type GatewayView struct {
	Error  string
	Models []string
}

// HermesSessionsView is one page of the org's Hermes sessions (state.db), newest first.
type HermesSessionsView struct {
	Frame DashboardFrame
	Query string // the search as typed
	// NoState says the home has no state.db: Hermes has not run there yet.
	NoState bool
	Busy    bool // state.db could not answer in time
	// Interrupted says state.db holds a write Hermes did not finish, which it recovers when
	// it next starts in the home.
	Interrupted bool
	Groups      []HermesSessionGroup
	// Newer says this page is not the first; First is the link back to the newest.
	Newer bool
	First templ.SafeURL
	Next  templ.SafeURL // the next (older) page; empty on the last
}

// HermesSessionGroup is a session and, under it, its subagent and compression children
// found on the same page.
type HermesSessionGroup struct {
	Session  HermesSessionRow
	Children []HermesSessionRow
}

// HermesSessionRow is one Hermes session as the list and the transcript's head show it.
type HermesSessionRow struct {
	ID    string
	Link  templ.SafeURL
	Title string // "" for an untitled session (every tool session)
	// Kind is "subagent" or "compression continuation" for a child whose parent is on the
	// page, "child" for one whose parent is not; empty for a top-level session.
	Kind       string
	Depth      int // below its group's session, 1 for a direct child
	ParentID   string
	ParentLink templ.SafeURL
	Source     string
	Model      string
	Started    string
	Ended      string // "open" while Hermes keeps it open
	EndReason  string
	Messages   int
	Tokens     string // "—" when Hermes kept no counters
	TokensIn   string
	TokensOut  string
	Cost       string // "—" when unpriced
}

// TranscriptView is one Hermes session's messages as a person reads them.
type TranscriptView struct {
	Frame       DashboardFrame
	Busy        bool
	Interrupted bool // as HermesSessionsView.Interrupted
	Session     HermesSessionRow
	Messages    []TranscriptMessage
	// Omitted counts the rows Hermes keeps but does not show (taken back, compacted away,
	// hidden scaffolding), which are left out.
	Omitted int
	// SystemChars is the system prompt's length; it is shown (folded) only when asked
	// for, through ShowSystemLink.
	SystemChars    int
	ShowSystem     bool
	SystemPrompt   string
	ShowSystemLink templ.SafeURL
	HideSystemLink templ.SafeURL
	// A long session is read a page at a time: Next leads to the later messages, First
	// back to the beginning (both empty when there is nowhere to go).
	Next, First templ.SafeURL
}

// TranscriptMessage is one message: long content folded after Preview, tool calls and
// tool results shown compactly and folded.
type TranscriptMessage struct {
	ID        int64
	Role      string
	Time      string
	Content   string
	Long      bool   // Content is folded; Preview is its start
	Preview   string // set when Long
	Chars     int
	ToolCalls []ToolCallView
	ToolName  string // for a tool result, the tool that answered
}

// ToolCallView is one tool call of an assistant message.
type ToolCallView struct {
	Name      string
	Arguments string // indented when it is JSON
	Chars     int
}

// MemoryView is the agent's memory files, read-only.
type MemoryView struct {
	Frame DashboardFrame
	Error string
	Files []MemoryFileView
}

// MemoryFileView is MEMORY.md or USER.md with its fill against Hermes' limit.
type MemoryFileView struct {
	Name    string
	Purpose string
	Exists  bool
	Entries []string
	Chars   int
	Limit   int
	Percent int
	Over    bool
}

// SkillsView is the org's skills, authored and bundled, and what is wrong with them.
type SkillsView struct {
	Frame DashboardFrame
	Error string // the skills could not be read (config.yaml that does not parse, ...)
	// UsageNote says why last use is not shown (state.db busy); empty when it is.
	UsageNote       string
	Skills          []SkillRow
	Broken          []BrokenSkillRow
	Duplicates      []DuplicateSkillRow
	Authored        int
	AuthoredEnabled int
	Max             int // SKILLS_MAX_AUTHORED; 0 when not known here
	BundledDir      string
}

// SkillRow is one skill.
type SkillRow struct {
	Name        string
	Description string
	Category    string
	Dir         string
	Source      string // authored, hub, seeded or bundled
	Disabled    bool
	LastUsed    string // "—" when nothing recorded it
	LastUsedBy  string // where the last use was read from
}

// BrokenSkillRow is a skill folder Hermes would not load, and why.
type BrokenSkillRow struct {
	Dir     string
	Bundled bool
	Reason  string
}

// DuplicateSkillRow is a skill name more than one folder claims.
type DuplicateSkillRow struct {
	Name string
	Dirs []string
}

// JobListView is one page of the org's jobs from the control API, newest first.
type JobListView struct {
	Frame DashboardFrame
	Error string // the control API did not answer
	Jobs  []JobRow
	First templ.SafeURL // back to the newest; empty on the first page
	Next  templ.SafeURL // the next (older) page; empty on the last
	// Live is the SSE stream's URL (Paths.Events) the page updates from; empty: not live
	// (an older page, whose rows a new job would not join).
	Live string
}

// LiveJobRow, LiveJobHead and LiveJobEvents are the SSE event names that carry job id's
// row in the list, its page's head and progress, and its page's new event rows. A job id
// is the backend's text, so the names hold a digest of it, never the id itself (nothing
// untrusted in sse-* attributes).
func LiveJobRow(id string) string    { return "jobrow-" + liveDigest(id) }
func LiveJobHead(id string) string   { return "jobhead-" + liveDigest(id) }
func LiveJobEvents(id string) string { return "jobevents-" + liveDigest(id) }

// LiveSubagentRow is the SSE event name that carries subagent id's row.
func LiveSubagentRow(id string) string { return "subagent-" + liveDigest(id) }

func liveDigest(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:12])
}

// The SSE events live pages listen for: a job the list has not shown (its first claim, or
// a re-claim that moves it to the top), a subagent the subagents page has not shown, and
// (every live page) a stream that could not pick up where the page left off. The first two
// reload the page that lists them, as the last does.
const (
	LiveJobs      = "jobs"
	LiveSubagents = "subagents"
	LiveReload    = "reload"
	// LiveLeases carries the leases page's table (its own stream, <prefix>/leases/events).
	LiveLeases = "leases"
)

// Events is the URL of the dashboard's SSE stream, resuming after event id after (negative:
// from when it connects).
func (p Paths) Events(after int64) string {
	return p.HX("/events" + resumeAfter(after))
}

// LeaseEvents is the URL of the leases page's SSE stream, resuming after lease event after
// (negative: from when it connects).
func (p Paths) LeaseEvents(after int64) string {
	return p.HX("/leases/events" + resumeAfter(after))
}

func resumeAfter(after int64) string {
	if after < 0 {
		return ""
	}
	return "?after=" + strconv.FormatInt(after, 10)
}

// LiveRefresh is the URL a live page asks when the stream says it missed events: the
// answer makes htmx reload the page.
func (p Paths) LiveRefresh() string { return p.HX("/events/refresh") }

// JobDetailView is one job, what its outcome says, its progress and its newest events.
type JobDetailView struct {
	Frame          DashboardFrame
	Job            JobRow
	Outcome        string // the worker's outcome status from its outcome event; "" before one
	Reason         string // the outcome's reason
	SkillsDisabled []string
	// Progress is what the worker's progress, checkpoint and resume events say was
	// persisted; nil when no event says anything about it (not a checkpointed run).
	Progress  *JobProgress
	Events    []JobEventRow
	Truncated bool // older events were left out
	// Live is the SSE stream's URL (Paths.Events, after the newest event shown); empty:
	// not live.
	Live string
}

// JobProgress is a checkpointed run's progress as its events state it: the categories
// persisted, and the total only when an event names one (the manifest's count is not
// in the events the worker writes today, so Total is usually 0 and only the count shows).
type JobProgress struct {
	Persisted  int
	Total      int // 0: not known from the events
	Percent    int // of Total; 0 when Total is not known
	Categories []string
}

// JobEventRow is one event of a job, its data shown as the worker wrote it.
type JobEventRow struct {
	ID      int64
	Attempt int
	Kind    string
	At      string
	Data    string
}

// SubagentsView is the org's subagents, running and finished, newest first.
type SubagentsView struct {
	Frame DashboardFrame
	Error string
	Rows  []SubagentRow
	// Live is the SSE stream's URL (Paths.Events) the rows update from; empty: not live.
	Live string
}

// SubagentRow is one subagent handle; Notice is the answer to the last action on the row
// (a refusal's reason, or what was done), shown in the row it swapped.
type SubagentRow struct {
	ID        string
	Goal      string
	Role      string
	Parent    string // the parent session or subagent
	Job       string
	Status    string
	Summary   string
	Pending   int
	Started   string
	Ended     string
	Cancelled string // who cancelled it and why
	Live      bool   // running or cancelling: the mailbox is read
	Running   bool   // running: Cancel and Send message are offered
	Notice    string
	Refused   bool // Notice is a refusal
	// Version orders what two renderings of the row show (the handle's last change, in
	// microseconds): static/app.js keeps the newer.
	Version string
}

// SubagentHX is the htmx URL of an action (cancel, messages) on subagent id. Subagent ids
// are checked by the control API (letters, digits and . _ : -) and escaped here as a path
// segment all the same, so the id cannot end the path or add to it.
func (p Paths) SubagentHX(id, action string) string {
	return p.HX("/subagents/" + url.PathEscape(id) + "/" + action)
}

// LeasesPageView is the org's home: and session: leases with their recent events.
type LeasesPageView struct {
	Frame     DashboardFrame
	Error     string
	Leases    []LeaseDetailRow
	Truncated bool
	Notice    string // what the last force release did, or why it was refused
	Refused   bool
	// Confirm is the key a force release is being confirmed for (the form asking a reason).
	Confirm string
	// Live is the leases' SSE stream (Paths.LeaseEvents); empty: not live.
	Live string
}

// LeaseDetailRow is one lease and its newest events.
type LeaseDetailRow struct {
	Key      string
	Holder   string // "" when free
	Held     bool
	Epoch    int64
	Acquired string
	Expires  string
	Confirm  templ.SafeURL // the page asking for the force release's reason
	Events   []LeaseEventRow
	Error    string // the events could not be read
}

// LeaseEventRow is one event of a lease's history.
type LeaseEventRow struct {
	Kind   string
	Holder string
	Epoch  int64
	Actor  string
	Reason string
	At     string
}

// NavChat is the chat page's entry in the dashboard's navigation.
const NavChat = "chat"

// ChatPageView is the chat page: a form to send a message to a new session or to one of
// the recent ones. Error says why the last message was refused; Message keeps its text.
type ChatPageView struct {
	Frame         DashboardFrame
	Sessions      []ChatSessionOption
	Session       string // the session chosen
	Message       string
	Error         string
	SessionsError string
}

// ChatSessionOption is one recent session to send to.
type ChatSessionOption struct {
	ID    string
	Label string
}

// ChatTurnView is one turn's page, whose fragment (ChatTurnFragment) refreshes itself
// while the turn is queued or running.
type ChatTurnView struct {
	Frame DashboardFrame
	Turn  ChatTurnState
}

// ChatTurnState is what the turn's fragment shows.
// Events of a chat turn's stream: each change carries the turn's fragment; the last says
// it ended (and the browser closes the stream rather than reconnect).
const (
	ChatTurnEvent    = "turn"
	ChatTurnEndEvent = "end"
)

type ChatTurnState struct {
	ID        string
	State     string // queued, running, done, stopped, failed
	Active    bool
	Message   string
	SessionID string
	Position  int
	Waiting   string // the lease key a queued turn waits for
	HeldBy    string
	// Jobs are the org's running jobs, shown while the turn waits for the home.
	Jobs      []ChatJobRow
	JobsError string
	Messages  []TranscriptMessage
	// MessagesError says why state.db's rows could not be read this time.
	MessagesError string
	Answer        string
	Reason        string
	Started       string
	Ended         string
	// Events is the turn's stream (server-sent events carrying this fragment each time the
	// turn changes, from Rev on), Stop the Stop form's action, Session the transcript.
	Events  string
	Rev     uint64
	Stop    templ.SafeURL
	Session templ.SafeURL
	NewTurn templ.SafeURL
}

// ChatJobRow is a running job in the way of a turn, with its progress.
type ChatJobRow struct {
	ID       string
	Type     string
	Status   string
	Attempt  int
	Progress string
	Updated  string
	Link     templ.SafeURL
}
