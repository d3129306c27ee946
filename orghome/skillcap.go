package orghome

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
)

// ErrStateBusy says state.db could not be read in time, so skill usage is unknown and the
// cap was not applied; the next agent start tries again. Guessing from file times instead
// would disable skills the agent used a minute ago.
var ErrStateBusy = errors.New("state.db busy: skill usage unknown, try again")

// ErrStateInterrupted says state.db holds a write Hermes did not finish (StatusInterrupted):
// usage is unknown until Hermes opens it again, which the agent start the cap ran before
// does. It is an ErrStateBusy, so the start goes on without the cap.
var ErrStateInterrupted = fmt.Errorf("state.db holds a write Hermes did not finish, which it recovers when it next starts: %w", ErrStateBusy)

// Where a skill's last use was read from, best first.
const (
	UsageStateDB = "state.db" // assistant tool calls to skill_view / skill_manage
	UsageSidecar = "skills/.usage.json"
	UsageModTime = "SKILL.md mtime" // no recorded use at all
)

// SkillUse is when an authored skill was last used, and how the host knows.
type SkillUse struct {
	Name     string
	Dir      string
	LastUsed time.Time
	Source   string // UsageStateDB, UsageSidecar or UsageModTime
}

// SkillUsage is the last use of each authored skill, least recently used first.
//
// The rule: a skill's last use is the latest of what Hermes itself recorded, in two places.
// state.db holds every assistant message; one whose tool_calls call skill_view or
// skill_manage with {"name": skill} used that skill at the message's timestamp (this is how
// Hermes' own insights count skill use, agent/insights.py). skills/.usage.json is Hermes'
// curator sidecar (tools/skill_usage.py): last_used_at, last_viewed_at, last_patched_at.
// Only a skill neither records falls back to its SKILL.md modification time, so a skill
// just written is not the first to go.
func (h *Home) SkillUsage(ctx context.Context, bundled *Bundled) ([]SkillUse, error) {
	skills, _, _, err := h.homeSkills()
	if err != nil {
		return nil, err
	}
	fromDB, err := h.stateSkillUsage(ctx)
	if err != nil {
		return nil, err
	}
	fromSidecar := h.sidecarSkillUsage()
	bundledNames := bundled.names()
	uses := make([]SkillUse, 0, len(skills))
	for _, s := range skills {
		if s.Source != SkillAuthored {
			continue
		}
		if bundledNames[s.Name] {
			continue // shares its name with a bundled skill: disabling it would disable both
		}
		u := SkillUse{Name: s.Name, Dir: s.Dir}
		if t, ok := fromDB[s.Name]; ok {
			u.LastUsed, u.Source = t, UsageStateDB
		}
		if t, ok := fromSidecar[s.Name]; ok && t.After(u.LastUsed) {
			u.LastUsed, u.Source = t, UsageSidecar
		}
		if u.Source == "" {
			u.LastUsed, u.Source = s.ModTime, UsageModTime
		}
		uses = append(uses, u)
	}
	sort.Slice(uses, func(i, j int) bool {
		if !uses[i].LastUsed.Equal(uses[j].LastUsed) {
			return uses[i].LastUsed.Before(uses[j].LastUsed)
		}
		return uses[i].Name < uses[j].Name
	})
	return uses, nil
}

func (h *Home) stateSkillUsage(ctx context.Context) (map[string]time.Time, error) {
	st, err := h.OpenState()
	if errors.Is(err, ErrNoSessions) {
		return map[string]time.Time{}, nil
	}
	if err != nil {
		return nil, err
	}
	defer st.Close()
	return st.SkillUsage(ctx)
}

// SkillUsage reads, from assistant tool calls, when each skill was last viewed or managed.
func (s *StateDB) SkillUsage(ctx context.Context) (map[string]time.Time, error) {
	out := map[string]time.Time{}
	l, err := s.load(ctx)
	if errors.Is(err, ErrNoSessions) {
		return out, nil
	}
	if err != nil {
		if e := s.usageErr(err); e != nil {
			return nil, e
		}
		return nil, err
	}
	if !l.messages["tool_calls"] || !l.messages["timestamp"] {
		return out, nil
	}
	rows, err := s.db.QueryContext(ctx, `SELECT tool_calls, timestamp FROM messages
		WHERE role = 'assistant' AND tool_calls IS NOT NULL
		AND (instr(tool_calls, 'skill_view') > 0 OR instr(tool_calls, 'skill_manage') > 0)`)
	if err != nil {
		if e := s.usageErr(err); e != nil {
			return nil, e
		}
		return nil, fmt.Errorf("skill usage of org %s: %w", s.home.ID, err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			calls string
			ts    float64
		)
		if err := rows.Scan(&calls, &ts); err != nil {
			return nil, fmt.Errorf("skill usage of org %s: %w", s.home.ID, err)
		}
		at := unixSeconds(ts)
		for _, c := range decodeToolCalls(calls) {
			if c.Name != "skill_view" && c.Name != "skill_manage" {
				continue
			}
			var args struct {
				Name string `json:"name"`
			}
			if json.Unmarshal([]byte(c.Arguments), &args) != nil {
				continue
			}
			// skill_view also takes "category/name"; the skill is the last part.
			name := strings.TrimSpace(args.Name)
			if i := strings.LastIndexByte(name, '/'); i >= 0 {
				name = name[i+1:]
			}
			if name != "" && at.After(out[name]) {
				out[name] = at
			}
		}
	}
	if err := rows.Err(); err != nil {
		if e := s.usageErr(err); e != nil {
			return nil, e
		}
		return nil, fmt.Errorf("skill usage of org %s: %w", s.home.ID, err)
	}
	return out, nil
}

// usageErr is the skill-usage error a read error of Hermes' state stands for, or nil.
func (s *StateDB) usageErr(err error) error {
	switch stateStatus(err) {
	case StatusInterrupted:
		return fmt.Errorf("skill usage of org %s: %w", s.home.ID, ErrStateInterrupted)
	case StatusBusy:
		return fmt.Errorf("skill usage of org %s: %w", s.home.ID, ErrStateBusy)
	}
	return nil
}

// sidecarSkillUsage reads skills/.usage.json; a missing or unreadable sidecar is no record,
// as it is for Hermes.
func (h *Home) sidecarSkillUsage() map[string]time.Time {
	out := map[string]time.Time{}
	raw, _, _, err := h.readLimited(skillsDir+"/.usage.json", 8<<20)
	if err != nil {
		return out
	}
	var records map[string]map[string]any
	if json.Unmarshal(raw, &records) != nil {
		return out
	}
	for name, rec := range records {
		for _, key := range []string{"last_used_at", "last_viewed_at", "last_patched_at"} {
			s, _ := rec[key].(string)
			if s == "" {
				continue
			}
			t, err := time.Parse(time.RFC3339Nano, s)
			if err != nil {
				// Python's isoformat() without an offset, which Hermes reads as UTC.
				if t, err = time.Parse("2006-01-02T15:04:05.999999", s); err != nil {
					continue
				}
			}
			if t.After(out[name]) {
				out[name] = t
			}
		}
	}
	return out
}

// CapResult says what one run of the skills cap did.
type CapResult struct {
	Max             int
	Authored        int        // authored skills the cap counts
	AlreadyDisabled []string   // authored skills config.yaml already disabled
	Disabled        []SkillUse // disabled by this run, least recently used first
	Enabled         int        // authored skills left enabled
}

// EnforceSkillCap keeps at most max authored skills enabled. Past the cap the least
// recently used (see SkillUsage) are added to config.yaml's skills.disabled, which is where
// Hermes reads it; nothing is deleted, bundled and Hub skills are never counted nor
// disabled, and a skill already disabled stays so (re-enabling is a person's decision).
// config.yaml is rewritten only when the list changes, keeping every other key and comment,
// atomically and with a receipt of the previous version. Running it again is a no-op.
func (h *Home) EnforceSkillCap(ctx context.Context, max int, bundled *Bundled) (CapResult, error) {
	if max < 1 {
		return CapResult{}, fmt.Errorf("skills cap of org %s: max %d is not at least 1", h.ID, max)
	}
	uses, err := h.SkillUsage(ctx, bundled)
	if err != nil {
		return CapResult{}, err
	}
	cfg, err := h.readConfig()
	if err != nil {
		return CapResult{}, err
	}
	disabled := cfg.disabledSkills()
	res := CapResult{Max: max, Authored: len(uses)}
	var enabled []SkillUse
	for _, u := range uses {
		if disabled[u.Name] {
			res.AlreadyDisabled = append(res.AlreadyDisabled, u.Name)
		} else {
			enabled = append(enabled, u)
		}
	}
	if over := len(enabled) - max; over > 0 {
		res.Disabled = enabled[:over]
		enabled = enabled[over:]
	}
	res.Enabled = len(enabled)
	if len(res.Disabled) == 0 {
		return res, nil
	}
	for _, u := range res.Disabled {
		disabled[u.Name] = true
	}
	cfg.setDisabledSkills(disabled)
	data, err := cfg.encode()
	if err != nil {
		return CapResult{}, err
	}
	if err := h.writeOwned(configFile, data, 0o600, cfg.exists); err != nil {
		return CapResult{}, fmt.Errorf("skills cap of org %s: %w", h.ID, err)
	}
	names := make([]string, len(res.Disabled))
	for i, u := range res.Disabled {
		names[i] = u.Name
	}
	h.Log.Info("skills cap disabled least recently used skills", "org", h.ID, "max", max,
		"authored", res.Authored, "disabled", names)
	return res, nil
}
